"""The NVML adapter: one backend over ``pynvml``, driving a real driver or the simulator."""
