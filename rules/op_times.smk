# Measured per-operator times (recorded by the trace rules beside each shard's trace), grouped into the
# operator trace's kinds, and the share of each held-out family's step in kinds its training families ran.


rule op_times:
    """Per (config, kind) measured operator time of one step: auxiliary labels, never features."""
    input:
        pkg("op_times.py"),
        ops=op_trace_files,
    output:
        OP_TIMES,
    log:
        "logs/features/op_times.log",
    benchmark:
        "benchmarks/features/op_times.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/op_times.py"


rule op_coverage:
    """Per held-out family of leave_one_family_out: share of its measured step in kinds seen in training."""
    input:
        pkg("op_coverage.py"),
        op_times=OP_TIMES,
        dataset="results/dataset/dataset.parquet",
        split="results/splits/leave_one_family_out.parquet",
    output:
        "results/evaluate/op_coverage.parquet",
    log:
        "logs/evaluate/op_coverage.log",
    benchmark:
        "benchmarks/evaluate/op_coverage.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/op_coverage.py"
