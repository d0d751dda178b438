"""The machine a plan runs on: one GPU's memory and peak, its links, and how racks group GPUs.
Every figure says where it comes from; the plan prints them beside what they feed."""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
GIB = 2**30

# torch.optim.AdamW's single-tensor CPU step (the path FSDP2's CPUOffloadPolicy runs: offload="all")
# against the least traffic of an update (28 bytes a parameter at the machine's copy bandwidth):
# 0.28 measured with `bench/plan_535b.py --host-adam` on this project's x86 machine (16M fp32
# parameters, 2 threads; eight separate elementwise passes instead of one fused one). Assumed to
# carry to a Grace CPU: no Grace figure is at hand.
HOST_ADAM_EFFICIENCY = 0.28


@dataclass(frozen=True)
class Hardware:
    """A cluster of racks of GPUs. The defaults are GB200 NVL72 (public spec sheets)."""

    name: str = "GB200 NVL72"
    gpus_per_rack: int = 72  # one NVLink domain
    hbm_gb: float = 186.0  # HBM3e per GPU, GB (1e9 bytes); the plan's target (Setup.memory_target_gib) sits below it
    peak_tflops: float = 2500.0  # dense bf16 per GPU
    hbm_tbps: float = 8.0  # HBM3e bandwidth per GPU, TB/s (elementwise recompute runs at this)
    nvlink_gbps: float = 900.0  # NVLink 5, GB/s each way per GPU, to any GPU of its rack
    network_gbits: float = 400.0  # between racks, Gb/s per GPU (one 400G NIC per GPU)
    host_link_gbps: float = 450.0  # NVLink-C2C of one Grace CPU, GB/s each way, shared by its GPUs
    host_gb: float = 240.0  # host memory per GPU: 480 GB LPDDR5X per Grace, one Grace per 2 GPUs
    gpus_per_host: int = 2  # GPUs sharing one Grace CPU and its memory (a GB200 superchip)
    host_mem_gbps: float = 512.0  # LPDDR5X bandwidth of one Grace, GB/s (spec: up to 512)
    host_limit: float = 0.75  # pinned optimizer state a plan may put in a GPU's share of host memory
    # (the rest: the OS, the data loader, Ray, checkpoint staging)
    link_efficiency: float = 0.8  # share of a link's rate a collective reaches (bus bandwidth)
    collective_latency_us: float = 20.0  # fixed cost of one collective call
    # One device-to-host sync (the expert dispatch's split sizes): the GPU drains its queue, the
    # small copy comes back, and the GPU idles until the host launches the next kernels. Assumed
    # (no GPU has measured it here): a few us for the copy's round trip plus about ten launches'
    # worth of host time (~2-3 us each) before the queue runs ahead again; bench/gpu_block_memory.py's
    # time per block includes the real one.
    host_sync_us: float = 30.0
    cuda_context_gb: float = 1.5  # CUDA context, kernels' modules and cuBLAS / cuDNN workspaces (assumed)
    # NCCL's own buffers: steps/scale/memory.py nccl_bytes, from NCCL's documented sizes

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * GB

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    def host_update_bytes_per_s(self) -> float:
        """Bytes/s of AdamW's ideal traffic one GPU's CPU update reaches: the Grace's memory at the
        links' efficiency (a copy's share of spec), times the share of that torch's CPU AdamW
        reaches (HOST_ADAM_EFFICIENCY, measured), split between the GPUs that share the Grace."""
        return self.host_mem_gbps * GB * self.link_efficiency * HOST_ADAM_EFFICIENCY / self.gpus_per_host

    def host_seconds(self, up: float, down: float) -> float:
        """Seconds one GPU's host traffic takes (`up` bytes to the GPU, `down` back) while every GPU
        of its Grace moves as much: the C2C link (each way) and the Grace's LPDDR5X (both
        directions together) are shared by `gpus_per_host` GPUs; the slower of the two counts."""
        c2c = max(up, down) * self.gpus_per_host / self.link_bytes_per_s("host")
        dram = (up + down) * self.gpus_per_host / (self.host_mem_gbps * GB * self.link_efficiency)
        return max(c2c, dram)

    def link_bytes_per_s(self, link: str) -> float:
        """Effective bytes/s each way on a link class ("nvlink", "network": one GPU's; "host": one
        Grace's C2C, which its GPUs share: `host_seconds`)."""
        raw = {"nvlink": self.nvlink_gbps * GB, "network": self.network_gbits / 8 * GB,
               "host": self.host_link_gbps * GB}[link]
        return raw * self.link_efficiency

    def assumptions(self) -> list[str]:
        return [
            f"{self.name}: {self.hbm_gb:g} GB HBM3e a GPU ({self.hbm_bytes / GIB:.1f} GiB), "
            f"{self.peak_tflops / 1000:g} PFLOP/s dense bf16, "
            f"{self.hbm_tbps:g} TB/s HBM",
            f"links a GPU, each way: NVLink 5 {self.nvlink_gbps:g} GB/s inside a rack of {self.gpus_per_rack}; "
            f"network {self.network_gbits:g} Gb/s between racks; NVLink-C2C {self.host_link_gbps:g} GB/s to "
            f"a Grace, shared by its {self.gpus_per_host} GPUs ({self.host_gb:g} GB host memory a GPU); collectives "
            f"reach {self.link_efficiency:.0%} of a link, +{self.collective_latency_us:g} us a call; "
            f"{self.cuda_context_gb:g} GB a GPU for the CUDA context and cuBLAS; NCCL's buffers from its "
            f"documented sizes (NCCL_BUFFSIZE {NCCL_BUFFSIZE >> 20} MiB a channel a connection, "
            f"{NCCL_P2P_CHANNELS_PER_PEER} channels a point-to-point peer, up to {NCCL_CHANNELS} channels a "
            f"communicator's ring, each with its LL and LL128 buffers)",
            f"host: one Grace per {self.gpus_per_host} GPUs, {self.host_mem_gbps:g} GB/s LPDDR5X (host traffic is "
            f"bound by the shared C2C or the shared LPDDR5X, whichever is slower); torch's CPU AdamW "
            f"reaches {HOST_ADAM_EFFICIENCY:.0%} of a memory-bound update (measured on x86: bench/plan_535b.py "
            f"--host-adam); pinned optimizer state under {self.host_limit:.0%} of the host memory a GPU",
        ]


# NCCL's buffers (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html): NCCL_BUFFSIZE,
# the SIMPLE protocol's buffer a channel and connection, 4 MiB by default; point-to-point traffic
# (an all-to-all is one send and one receive a peer) opens NCCL_NCHANNELS_PER_NET_PEER channels a
# peer, 2 by default, SIMPLE only; a ring or tree collective up to NCCL_MAX_NCHANNELS channels,
# taken as 32 (assumed: all of them on NVLink), each connection with the LL (512 KiB) and LL128
# (4.7 MiB) buffers beside SIMPLE's (NCCL's compiled-in sizes; assumed, not documented).
NCCL_BUFFSIZE = 4 * 2**20
NCCL_P2P_CHANNELS_PER_PEER = 2
NCCL_CHANNELS = 32
NCCL_CONNECTION_BYTES = NCCL_BUFFSIZE + 4.7 * 2**20 + 0.5 * 2**20  # SIMPLE + LL128 + LL


GB200_NVL72 = Hardware()
