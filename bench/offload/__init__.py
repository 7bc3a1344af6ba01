"""The KV offload tiers (host memory, disk) on a CPU and the GPU-host transfer."""
