"""Every claim the book tests (:data:`CLAIMS`), by paper, each with its chapter,
metric, bound, margin and their sources, written before any run (the rule that
judges them: :mod:`wslib.runs.claims`)."""

from __future__ import annotations

from wslib.runs.claims import BOOK_LOSS, BOOK_POINTS, BOOK_RATIO, Claim
from wslib.runs.verdicts import (
    LOSS_MARGIN,
    POINTS_MARGIN,
    RATIO_MARGIN,
)

PAPERS = {
    "foundations": "Foundations (chapter 1)",
    "llpf": "Low-Loss Path Finding",
    "pathcond": "PathCond",
    "fusion": "HF / KF fusion",
    "synthesis": "Across the papers (chapter 12)",
}

CHAPTER_1 = "01_symmetries"
FOUNDATION_CLAIMS: tuple[Claim, ...] = (
    *(
        Claim(
            f"barrier-{name}",
            "foundations",
            f"Two independently trained {name} modes are separated by a loss "
            "barrier on the straight line between them.",
            CHAPTER_1,
            f"{name}/linear_barrier",
            ">",
            0.1,
        )
        for name in ("mlp", "cnn", "resnet")
    ),
    *(
        Claim(
            f"alignment-{name}",
            "foundations",
            f"Aligning the {name}'s neurons (weight matching) removes at least "
            "half of that barrier.",
            CHAPTER_1,
            f"{name}/aligned_barrier",
            "<",
            0.5,
            per=f"{name}/linear_barrier",
        )
        for name in ("mlp", "cnn", "resnet")
    ),
    *(
        Claim(
            f"symmetry-{kind}",
            "foundations",
            f"A {kind} of ReLU neurons leaves the function unchanged (largest "
            "output change below float32 noise).",
            CHAPTER_1,
            f"{kind}_invariance_max_abs_diff",
            "<",
            1e-4,
        )
        for kind in ("permutation", "rescaling")
    ),
)

LLPF = "03_llpf_m2m"
ARCHS = ("mlp", "cnn", "resnet", "transformer")
LLPF_CLAIMS: tuple[Claim, ...] = (
    *(
        Claim(
            f"llpf-low-loss-{arch}",
            "llpf",
            f"LLPF joins two independent {arch} modes by a path whose training loss "
            "stays within 0.1 of the larger endpoint loss.",
            LLPF,
            f"{arch}/llpf_peak_excess",
            "<",
            0.1,
        )
        for arch in ARCHS
    ),
    Claim(
        "llpf-reproducible",
        "llpf",
        "LLPF paths are reproducible: the peak excess moves little between path "
        "seeds (standard deviation below 0.02).",
        LLPF,
        "seed_std_peak_excess",
        "<",
        0.02,
    ),
    Claim(
        "llpf-continuous",
        "llpf",
        "The recorded points form a continuous low-loss path: the loss at the "
        "midpoint of every segment rises by less than 0.1.",
        LLPF,
        "max_segment_midpoint_rise",
        "<",
        0.1,
    ),
    *(
        Claim(
            f"llpf-fdf-{arch}",
            "llpf",
            f"Following the data flow layer by layer gives a lower peak than moving "
            f"all layers at once ({arch}, mean over path seeds).",
            LLPF,
            f"ablation_by_arch/{arch}/over_seeds_difference_mean",
            ">",
            0.0,
            margin=LOSS_MARGIN,
            margin_source=BOOK_LOSS,
        )
        for arch in ARCHS  # the paper's point: deeper nets need the data-flow order
    ),
    *(
        Claim(
            f"llpf-vs-autoneb-{arch}",
            "llpf",
            f"At equal gradient steps LLPF's peak is lower than AutoNEB's ({arch}; "
            "the simplified AutoNEB of chapter 4; the cnn is the chapter's conv net, "
            "ResNet-18 in the gpu profile).",
            "04_llpf_baselines",
            f"{arch}/autoneb_simplified_peak_excess",
            ">",
            0.0,
            minus=f"{arch}/llpf_peak_excess",
            margin=LOSS_MARGIN,
            margin_source=BOOK_LOSS,
        )
        for arch in ("mlp", "cnn")
    ),
    *(
        Claim(
            f"llpf-single-layer-{arch}",
            "llpf",
            f"Moving a single layer towards the other mode raises the loss less "
            f"than moving the whole {arch} (first step of the straight line).",
            "02_layerwise",
            f"{arch}/max_single_first_step_increase",
            "<",
            1.0,
            per=f"{arch}/whole_first_step_increase",
            margin=RATIO_MARGIN,
            margin_source=BOOK_RATIO,
        )
        for arch in ("mlp", "cnn", "resnet")
    ),
    Claim(
        "llpf-spheres",
        "llpf",
        "M2O then M2M joins modes on different variance spheres with a low-loss "
        "path (peak excess below 0.1).",
        "05_llpf_spheres",
        "hybrid_peak_excess",
        "<",
        0.1,
    ),
    Claim(
        "llpf-sharp",
        "llpf",
        "Sharp minima (no weight decay, constant learning rate) are connected "
        "too (peak excess below 0.1).",
        "05_llpf_spheres",
        "sharp_peak_excess",
        "<",
        0.1,
    ),
)

PATHCOND = "07_pathcond_mlp"
PATHCOND_CLAIMS: tuple[Claim, ...] = (
    *(
        Claim(
            f"pathcond-faster-{config}",
            "pathcond",
            f"PathCond reaches 99% training accuracy in fewer epochs than SGD from "
            f"the default initialisation ({label}; each method at its tuned rate).",
            PATHCOND,
            f"{config}/speedup_pathcond_best_lr/value",
            ">",
            1.0,
            margin=RATIO_MARGIN,
            margin_source="book convention: a 5% speed-up (the paper reports "
            "speed-ups of up to 1.5x, section 5.1)",
        )
        for config, label in (
            ("varwidth", "variable widths"),
            ("lowvar_03", "low-variance initialisation, a = 0.3"),
            ("lowvar_01", "low-variance initialisation, a = 0.1"),
        )
    ),
    Claim(
        "pathcond-small-effect-const",
        "pathcond",
        "With constant widths and the default variance the effect is small "
        "(speed-up below 1.1x).",
        PATHCOND,
        "const/speedup_pathcond_best_lr/value",
        "<",
        1.1,
    ),
    *(
        Claim(
            f"pathcond-test-acc-{config}",
            "pathcond",
            f"PathCond loses no test accuracy ({label}; at most 1 point below SGD).",
            PATHCOND,
            f"{config}/best_lr_runs/pathcond/test_acc",
            ">",
            -0.01,
            minus=f"{config}/best_lr_runs/baseline/test_acc",
        )
        for config, label in (
            ("varwidth", "variable widths"),
            ("lowvar_01", "low-variance initialisation, a = 0.1"),
        )
    ),
    Claim(
        "pathcond-cost",
        "pathcond",
        "Computing the rescaling costs at most about one training epoch "
        "(the paper: 22% to 103%).",
        PATHCOND,
        "const/rescale_over_epoch",
        "<",
        1.03,
        timed=True,
    ),
    Claim(
        "pathcond-function",
        "pathcond",
        "The PathCond rescaling leaves the network's function unchanged (relative "
        "output change below 1e-5, float32 rounding).",
        "06_pathlifting",
        "function_change_max_rel",
        "<",
        1e-5,
    ),
    Claim(
        "pathcond-diag-g",
        "pathcond",
        "diag G from one backward pass of the squared network equals the sum "
        "over explicitly enumerated paths.",
        "06_pathlifting",
        "diagG_max_rel_err",
        "<",
        1e-9,
    ),
    *(
        Claim(
            f"pathcond-faster-{net}",
            "pathcond",
            f"PathCond lowers the training loss faster than the default "
            f"initialisation on {label} (final loss ratio below 1).",
            "08_pathcond_conv",
            f"{net}/final_loss_ratio_pathcond_over_baseline",
            "<",
            1.0,
            margin=RATIO_MARGIN,
            margin_source=BOOK_RATIO,
        )
        for net, label in (
            ("fully_conv", "a fully convolutional net"),
            ("resnet_bn", "a ResNet with BatchNorm"),
            ("autoencoder", "an autoencoder (MSE loss)"),
        )
    ),
)

FUSION_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "fusion-sharded-vs-otfusion",
        "fusion",
        "On sharded data the best HF/KF fusion (chosen on validation) beats "
        "OTFusion (2 models, points of accuracy).",
        "10_fusion_regimes",
        "headline/sh_gap_ot",
        ">",
        0.0,
        margin=POINTS_MARGIN,
        margin_source=BOOK_POINTS,
    ),
    Claim(
        "fusion-sharded-vs-averaging",
        "fusion",
        "On sharded data the best HF/KF fusion beats vanilla averaging.",
        "10_fusion_regimes",
        "headline/sh_gap_avg",
        ">",
        0.0,
        margin=POINTS_MARGIN,
        margin_source=BOOK_POINTS,
    ),
    Claim(
        "fusion-6-way-robust",
        "fusion",
        "With the most models on sharded data, HF/KF stay ahead of OTFusion.",
        "10_fusion_regimes",
        "headline/shmax_gap_ot",
        ">",
        0.0,
        margin=POINTS_MARGIN,
        margin_source=BOOK_POINTS,
    ),
    Claim(
        "fusion-full-zero-shot",
        "fusion",
        "On the full data the fused model is within 1 point of the individual "
        "models without fine-tuning.",
        "10_fusion_regimes",
        "headline/full_gap",
        ">",
        -1.0,
    ),
    *(
        Claim(
            f"fusion-importance-{method}",
            "fusion",
            f"{label} importance scores improve HF/KF over uniform weights "
            "(mean gain in points).",
            "10_fusion_regimes",
            f"headline/gain_{method}",
            ">",
            0.0,
            margin=POINTS_MARGIN,
            margin_source=BOOK_POINTS,
        )
        for method, label in (("conductance", "Conductance"), ("deeplift", "DeepLIFT"))
    ),
    Claim(
        "fusion-compression-vs-kd",
        "fusion",
        "Compressing a wide model into a narrow one with KF beats knowledge "
        "distillation when data is limited.",
        "11_fusion_beyond",
        "compression_acc",
        ">",
        0.0,
        minus="kd_acc",
        margin=0.01,
        margin_source="book convention: 1 point of accuracy (0.01: the "
        "accuracies are fractions)",
    ),
    Claim(
        "fusion-theorem-1",
        "fusion",
        "Theorem 1: the fused output splits exactly into the approximation and "
        "grouping terms.",
        "09_fusion_cost",
        "theorem1_max_rel_err",
        "<",
        1e-6,
    ),
    Claim(
        "fusion-self",
        "fusion",
        "Fusing a model with itself returns the model.",
        "10_fusion_regimes",
        "self_fusion_max_abs_diff",
        "<",
        1e-5,
    ),
)

SYNTHESIS = "12_synthesis"
SYNTHESIS_CLAIMS: tuple[Claim, ...] = (
    *(
        Claim(
            f"synthesis-scale-matching-{arch}",
            "synthesis",
            "Alignment needs both symmetries: matching per-neuron scales after "
            f"weight matching lowers the barrier ({arch}).",
            SYNTHESIS,
            f"alignment/{arch}/WM + scale matching/barrier_mean",
            "<",
            0.0,
            minus=f"alignment/{arch}/weight matching/barrier_mean",
            margin=LOSS_MARGIN,
            margin_source=BOOK_LOSS,
        )
        for arch in ("mlp", "cnn", "resnet")
    ),
    *(
        Claim(
            f"synthesis-basin-{variant}",
            "synthesis",
            f"A KF-{variant.capitalize()} fused model, fine-tuned, lands in its "
            "parents' basin: its barrier to a parent is below the aligned parents'.",
            SYNTHESIS,
            f"fused_parent/{variant}/barrier/mean",
            "<",
            0.0,
            minus="parent_parent/aligned/barrier/mean",
            margin=LOSS_MARGIN,
            margin_source=BOOK_LOSS,
        )
        for variant in ("linear", "gradient")
    ),
    Claim(
        "synthesis-llpf-conditioning",
        "synthesis",
        "The low-loss LLPF path is better conditioned (lower AM/GM of diag G) "
        "than the straight line between the same modes.",
        SYNTHESIS,
        "conditioning/LLPF/amgm_mean/mean",
        "<",
        0.0,
        minus="conditioning/straight line/amgm_mean/mean",
        margin=0.05,
        margin_source="book convention: 0.05 of AM/GM (which is 1 for a perfectly "
        "conditioned point)",
    ),
    Claim(
        "synthesis-gauge-path-loss",
        "synthesis",
        "Rescaling every point of a path to its PathCond gauge leaves the loss "
        "along the path unchanged.",
        SYNTHESIS,
        "gauge_loss_change_max",
        "<",
        1e-4,
    ),
    *(
        Claim(
            f"synthesis-gauge-fusion-{regime}",
            "synthesis",
            f"Fusing in PathCond's gauge raises KF-Linear's accuracy ({regime} data).",
            SYNTHESIS,
            f"gauge_fusion/{regime}/kf_linear/with/mean",
            ">",
            0.0,
            minus=f"gauge_fusion/{regime}/kf_linear/without/mean",
            margin=0.01,
            margin_source="book convention: 1 point of accuracy (0.01: the "
            "accuracies are fractions)",
        )
        for regime in ("full", "sharded")
    ),
)

CLAIMS: tuple[Claim, ...] = (
    *FOUNDATION_CLAIMS,
    *LLPF_CLAIMS,
    *PATHCOND_CLAIMS,
    *FUSION_CLAIMS,
    *SYNTHESIS_CLAIMS,
)
"""Every claim of the book, in the ledger's order: by paper, then by chapter."""
