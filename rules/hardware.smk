rule hardware:
    """Describe one device: identity, spec-sheet peaks and measured GEMM/copy microbenchmarks."""
    input:
        pkg("hardware.py"),
    output:
        "results/hardware/{device}.json",
    params:
        device=device_config,
    threads: device_threads
    log:
        "logs/hardware/{device}.log",
    benchmark:
        "benchmarks/hardware/{device}.tsv"
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/hardware.py"
