# Run the notebooks, build the study book and test it.
#   make book [PROFILE=cpu] [SEED=N] [JOBS=J]   run every notebook (J side by side,
#                                            default one per core), then build book/_build/html
#   make book SEEDS="0 1 2 3 4"              the sweep over those seeds (what is current is
#                                            skipped), then the book: first seed's pages,
#                                            every seed in the claims ledger
#   make book SEEDS=auto                     seeds 0-4, then 5-9 and 10-19 only for the
#                                            chapters with an undecided claim
#   make notebook NB=01_symmetries [SEED=N] [PROFILE=cpu]
#   make sweep [SEEDS="0 1 2"] [NB="03_llpf_m2m ..."] [PROFILE=cpu] [EXECUTOR=local|slurm]
#              [SPLIT=1]   long chapters as one job per unit (path, run group), then the notebook
#   make book EDITION=student                   the same book without solutions (book/_student/)
#   make publish [EDITION=full|student] [PUSH=1]   commit the built HTML to the gh-pages branch
#   make data [DATA="mnist fashion_mnist cifar10 cifar100"]   download image data sets (gpu profile)
#   make gpu-check  on a CUDA machine (<= 5 min): smoke notebooks on the GPU, step timings,
#                   the gpu book's estimated time per chapter
#   make test [TEST_WORKERS=N]   lint (ruff format --check, ruff check, lint-imports, mypy),
#                  then pytest (N > 1: on N pytest-xdist workers; default 1, serial)
#   make test-fast lint, then the tests not marked slow (no notebook, book or browser)
#   make mutants [LISTS="tests/llpf/planted_bugs.yaml ..."] [JOBS=J]   plant each listed
#                  bug alone in a scratch copy and check that its tests fail (hours)
#   make mutation [MODULE="runs/verdicts ..."] [JOBS=J]   mutmut's generated mistakes in
#                  each module against its package's fast tests: a table in build/mutation
#   make lint | make format   ruff on the .py files and the chapters' code cells
#   make clean | make clean-data
PROFILE ?= cpu
SEED ?=
JOBS ?=
ALLOW_CPU ?=
NB ?=
SEEDS ?=
SWEEP_SEEDS := $(or $(SEEDS),0 1 2)
EDITION ?= full
PUSH ?=
SPLIT ?=
LISTS ?=
MODULE ?=
# pytest-xdist workers for make test: on 2 cores the suite is bound by its
# notebook runs, which already compute side by side (1283 s on 2 workers against
# 1117 s serial, measured on the build machine; with forked kernels 1039 s serial
# and over 24 min on 2 workers, whose background runs start only when a test
# reads them), so the default is 1 (serial)
TEST_WORKERS ?= 1
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)
GHP_IMPORT ?= $(VENV)/bin/ghp-import
EXECUTOR ?= local
DATA ?= mnist fashion_mnist cifar10 cifar100

# A flag is on for 1, yes or true and off for 0, no, false or empty; any other
# value stops make (PUSH=0 must not push). $(call flag,NAME) is 1 or empty.
flag = $(if $(filter 1 yes true,$($(1))),1,$(if $(filter-out 0 no false,$($(1))),$(error $(1)='$($(1))' is not a flag; use 1, yes or true to switch it on, 0, no or false to leave it off)))
ALLOW_CPU_ON := $(call flag,ALLOW_CPU)
PUSH_ON := $(call flag,PUSH)
SPLIT_ON := $(call flag,SPLIT)

VENV := .venv
PY := $(VENV)/bin/python
# the console script of the book's tooling (bookkit/__init__.py lists its commands)
BOOKKIT := $(VENV)/bin/bookkit
STAMP := $(VENV)/.installed
PROFILES := $(sort $(basename $(notdir $(wildcard notebooks/params/*.yaml))))
NOTEBOOKS := $(sort $(basename $(notdir $(wildcard notebooks/*.md))))
SEED_ARG := $(if $(SEED),--seed $(SEED))$(if $(JOBS), --jobs $(JOBS))$(if $(ALLOW_CPU_ON), --allow-cpu)
# SEEDS=auto: the stages of wslib.runs.stages (seeds 0-4, then more where undecided)
FIRST_SEED := $(if $(filter auto,$(SEEDS)),0,$(firstword $(SEEDS)))
EXECUTED := build/$(PROFILE)$(if $(SEEDS),/seed-$(FIRST_SEED),$(if $(SEED),/seed-$(SEED)))
SWEEP_ARGS = --profile $(PROFILE) --executor $(EXECUTOR) $(if $(JOBS),--jobs $(JOBS)) \
	$(if $(SPLIT_ON),--split) $(NB) --seeds $(SWEEP_SEEDS)

# Check the arguments while the makefile is read, before anything is built:
# $(call check,NAME,value,valid values) stops make unless value is one valid word.
check = $(if $(and $(filter 1,$(words $(2))),$(filter $(2),$(3))),,$(error unknown $(1) '$(2)'; valid: $(3)))
GOALS := $(or $(MAKECMDGOALS),book)
ifneq ($(filter book notebook,$(GOALS)),)
  $(call check,PROFILE,$(PROFILE),$(PROFILES))
  ifneq ($(and $(SEED),$(SEEDS)),)
    $(error give SEED=N (one seed) or SEEDS="..." (a sweep), not both)
  endif
endif
ifneq ($(filter notebook,$(GOALS)),)
  $(call check,NB,$(NB),$(NOTEBOOKS))
endif
ifneq ($(filter book publish,$(GOALS)),)
  $(call check,EDITION,$(EDITION),full student)
endif
ifneq ($(filter sweep,$(GOALS)),)
  $(call check,PROFILE,$(PROFILE),$(PROFILES))
  $(call check,EXECUTOR,$(EXECUTOR),local slurm)
endif

HTML := $(if $(filter student,$(EDITION)),book/_student/_build/html,book/_build/html)

.PHONY: book notebook sweep publish data gpu-check lint format test test-fast mutants mutation clean clean-data

book: $(STAMP)
	@start=$$(date +%s) && \
	$(if $(SEEDS),$(BOOKKIT) sweep $(SWEEP_ARGS),$(BOOKKIT) run --profile $(PROFILE) $(SEED_ARG)) && \
	$(BOOKKIT) build $(EXECUTED) --edition $(EDITION) && \
	echo "Book built: open $(CURDIR)/$(HTML)/index.html" && \
	echo "Wall time of the whole build: $$(( $$(date +%s) - start )) s"

notebook: $(STAMP)
	$(BOOKKIT) run --profile $(PROFILE) $(SEED_ARG) $(NB)

# One job per (notebook, seed); a restarted sweep runs only what is missing.
sweep: $(STAMP)
	$(BOOKKIT) sweep $(SWEEP_ARGS)

# The built HTML of one edition as the only commit of branch gh-pages (with
# .nojekyll, so GitHub Pages serves Sphinx's _static folder); PUSH=1 pushes it.
publish:
	@test -f $(HTML)/index.html || { echo "error: no built $(EDITION) edition in $(HTML); run make book EDITION=$(EDITION) first" >&2; exit 2; }
	$(GHP_IMPORT) -n -f -b gh-pages -m "Publish the $(EDITION) edition of the book" $(if $(PUSH_ON),-p) $(HTML)
	@echo "Published $(HTML) to branch gh-pages$(if $(PUSH_ON), and pushed it)"

data: $(STAMP)
	@$(BOOKKIT) download $(DATA)

gpu-check: $(STAMP)
	$(BOOKKIT) gpu-check $(if $(ALLOW_CPU_ON),--allow-cpu)

# ruff covers the .py files and, through `bookkit lint`, the chapters' code
# cells (which it also type-checks with mypy); the contracts of pyproject.toml are
# checked by lint-imports; mypy checks the types of wslib and bookkit (the files
# and settings of [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(BOOKKIT) lint
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
	$(BOOKKIT) lint --fix

# TEST_WORKERS=N (N > 1): N pytest-xdist workers, tests that share an expensive
# fixture grouped (--dist loadgroup, the groups of tests/conftest.py).
# The tests start about 200 Python processes: with PYTHONDONTWRITEBYTECODE set
# (some containers set it) each compiled the library again and each pytest
# rewrote every test module (a collection: 12 CPU-s, against 7 with the caches),
# so the tests run without it (the __pycache__ folders are ignored by git).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest
test: lint
	$(PYTEST) $(XDIST)

test-fast: lint
	$(PYTEST) $(XDIST) -m "not slow"

mutants: $(STAMP)
	$(PY) tests/mutants.py $(LISTS) $(if $(JOBS),--jobs $(JOBS))

mutation: $(STAMP)
	$(PY) -m tests.mutation $(MODULE) $(if $(JOBS),--jobs $(JOBS))

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --no-compile -e ".[book,test]"
	@# byte-compile on every core (pip compiles on one: about 30 s more on 2 cores);
	@# a few files written for newer Pythons do not compile, as under pip; the
	@# packages' own test folders (a quarter of the files) are never imported
	$(PY) -m compileall -q -j 0 -x '/tests?/' $(VENV)/lib >/dev/null || true
	touch $@

clean:
	rm -rf build results book/_build book/_student book/chapters book/ledger.md book/guide.md book/_static/ledger

clean-data:
	find data -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
