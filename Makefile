# Run the notebooks, build the study book and test it.
#   make book [PROFILE=cpu] [SEED=N] [JOBS=J]   run every notebook (J side by side,
#                                            default one per core), then build book/_build/html
#   make notebook NB=01_symmetries [SEED=N] [PROFILE=cpu]
#   make sweep SEEDS="0 1 2" [NB="03_llpf_m2m ..."] [PROFILE=cpu] [EXECUTOR=local|slurm]
#   make data [DATA="mnist fashion_mnist cifar10 cifar100"]   download image data sets (gpu profile)
#   make test      lint (ruff format --check, ruff check, lint-imports), then pytest
#   make lint | make format | make clean | make clean-data
PROFILE ?= cpu
SEED ?=
JOBS ?=
ALLOW_CPU ?=
NB ?=
SEEDS ?= 0 1 2
EXECUTOR ?= local
DATA ?= mnist fashion_mnist cifar10 cifar100

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROFILES := $(sort $(basename $(notdir $(wildcard notebooks/params/*.yaml))))
NOTEBOOKS := $(sort $(basename $(notdir $(wildcard notebooks/*.ipynb))))
SEED_ARG := $(if $(SEED),--seed $(SEED))$(if $(JOBS), --jobs $(JOBS))$(if $(ALLOW_CPU), --allow-cpu)
EXECUTED := build/$(PROFILE)$(if $(SEED),/seed-$(SEED))

# Check the arguments while the makefile is read, before anything is built:
# $(call check,NAME,value,valid values) stops make unless value is one valid word.
check = $(if $(and $(filter 1,$(words $(2))),$(filter $(2),$(3))),,$(error unknown $(1) '$(2)'; valid: $(3)))
GOALS := $(or $(MAKECMDGOALS),book)
ifneq ($(filter book notebook,$(GOALS)),)
  $(call check,PROFILE,$(PROFILE),$(PROFILES))
endif
ifneq ($(filter notebook,$(GOALS)),)
  $(call check,NB,$(NB),$(NOTEBOOKS))
endif
ifneq ($(filter sweep,$(GOALS)),)
  $(call check,PROFILE,$(PROFILE),$(PROFILES))
  $(call check,EXECUTOR,$(EXECUTOR),local slurm)
endif

.PHONY: book notebook sweep data lint format test clean clean-data

book: $(STAMP)
	@start=$$(date +%s) && \
	$(PY) notebooks/run.py --profile $(PROFILE) $(SEED_ARG) && \
	$(PY) book/build.py $(EXECUTED) && \
	echo "Book built: open $(CURDIR)/book/_build/html/index.html" && \
	echo "Wall time of the whole build: $$(( $$(date +%s) - start )) s"

notebook: $(STAMP)
	$(PY) notebooks/run.py --profile $(PROFILE) $(SEED_ARG) $(NB)

# One job per (notebook, seed); a restarted sweep runs only what is missing.
sweep: $(STAMP)
	$(PY) notebooks/sweep.py --profile $(PROFILE) --executor $(EXECUTOR) \
		--seeds $(SEEDS) $(if $(JOBS),--jobs $(JOBS)) $(NB)

data: $(STAMP)
	@$(PY) notebooks/download.py $(DATA)

# ruff covers .py files and notebooks (pyproject.toml: extend-include); the
# layers contract of pyproject.toml is checked by lint-imports.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint
	$(PY) -m pytest

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -e ".[book,test]"
	touch $@

clean:
	rm -rf build results book/_build book/chapters

clean-data:
	find data -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
