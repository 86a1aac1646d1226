# One pair of rules per configured device, so one device can be (re)run alone:
#   snakemake profile_<device>                  measure (or resume) that device's shards
#   snakemake --forcerun trace_<device>         measure it afresh, then everything downstream


def quiet_threads(device):
    """Threads of a measuring job: in a local run every core Snakemake was given (it caps the number), so no
    other job of the run shares the cores while a device is measured; on a cluster the device's threads
    (its request; the ``exclusive`` flag asks for a node of its own). What is measured always uses the
    device's configured ``threads``, whatever the job gets."""
    return device_threads(device) if not workflow.local_exec else 1_000_000


for _device in DEVICES:

    rule:
        name:
            f"hardware_{_device}"
        input:
            pkg("hardware.py"),
        output:
            f"results/hardware/{_device}.json",
        log:
            f"logs/hardware/{_device}.log",
        benchmark:
            f"benchmarks/hardware/{_device}.tsv"
        conda:
            "../envs/perfzoo.yaml"
        threads: quiet_threads(_device)
        resources:
            **device_resources(_device),
            runtime=10,
        params:
            name=_device,
            device=config["devices"][_device],
        script:
            "../workflow/scripts/hardware.py"

    rule:
        name:
            f"trace_{_device}"
        input:
            pkg("profile.py"),
            manifest="results/zoo/manifest.parquet",
            hardware=f"results/hardware/{_device}.json",
            model_files=MODEL_FILES,
        output:
            traces=f"results/traces/{_device}/{{shard}}.parquet",
            sensors=f"results/traces/{_device}/{{shard}}.sensors.parquet",
            ops=f"results/traces/{_device}/{{shard}}.ops.parquet",
            meta=f"results/traces/{_device}/{{shard}}.meta.json",
        log:
            f"logs/profile/{_device}/{{shard}}.log",
        benchmark:
            f"benchmarks/profile/{_device}/{{shard}}.tsv"
        conda:
            "../envs/perfzoo.yaml"
        threads: quiet_threads(_device)
        resources:
            **device_resources(_device),
            runtime=runtime_for_attempt(_device),
            attempt=attempt_number,
        params:
            name=_device,
            device=config["devices"][_device],
            profiling=config["profiling"],
            num_classes=config["zoo"]["num_classes"],
            journal=f"results/traces/{_device}/{{shard}}.journal.jsonl",
        script:
            "../workflow/scripts/profile.py"

    rule:
        name:
            f"profile_{_device}"
        default_target: False
        input:
            expand(f"results/traces/{_device}/{{shard}}.parquet", shard=SHARDS),
            f"results/hardware/{_device}.json",
        localrule: True
