"""What this host has: GPUs (NVML) and the toolchain's versions."""
