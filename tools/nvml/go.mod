// Only for NVIDIA's nvml.h: go-nvml ships the header NVIDIA publishes, and the simulated
// libnvidia-ml.so.1 is compiled against it (tools/nvml/build.sh). Nothing here is Go code.
module tessera.dev/tools/nvml

go 1.23

require github.com/NVIDIA/go-nvml v0.13.4-1
