"""Sensor logs recorded outside perfzoo's own profiler: ``nvidia-smi --query-gpu`` CSV logs, perfzoo's
own NVML sample files, an external power meter (ElmorLabs PMD), and the energy fidelity of the NVML
power fields measured against that meter."""
