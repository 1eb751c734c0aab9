"""The one table of MIG-capable GPU models: every profile, its NVML ids, size, engines and placements.

This module is the single source of truth for MIG geometry. Everything else (resource names, the
layout model, the NVML simulator, the planner, ``tessera catalogue``) is derived from it, so a fact
fixed here is fixed everywhere. Rows were compiled from NVIDIA's MIG user guide, real
``nvidia-smi mig -lgip/-lgipp`` transcripts and NVIDIA's mig-parted defaults (see
``shared/reference/mig_facts.md``); a value that was estimated rather than read off a real card is
listed in the row's ``unverified`` fields (or the model's, when it holds for every profile), so
users can see which rows were measured.

Columns of a profile row: name, NVML ``NVML_GPU_INSTANCE_PROFILE_*`` constant (without prefix),
the device-specific profile id NVML returns in ``info.id``, compute slices, memory slices, memory
MiB (``memorySizeMB``), maximum instance count, SM count, engines (copy, decoder, encoder, JPEG,
OFA), valid placement starts (in memory slices; the size is the memory-slice count), and the
fields that are not verified on a real card.
"""

from __future__ import annotations

from typing import NamedTuple


class _P(NamedTuple):
    name: str
    constant: str
    profile_id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_count: int
    sm_count: int
    engines: tuple[int, int, int, int, int]
    starts: tuple[int, ...]
    unverified: tuple[str, ...]


class _Model(NamedTuple):
    name: str
    product_names: tuple[str, ...]
    pci_device_ids: tuple[int, ...]
    architecture: str
    total_memory_mib: int
    memory_slices: int
    compute_slices: int
    max_gpu_instances: int
    min_driver: str | None
    source: str
    unverified: tuple[str, ...]
    profiles: tuple[_P, ...]


MODELS: tuple[_Model, ...] = (
    _Model(
        name="A30-24GB",
        product_names=('NVIDIA A30',),
        pci_device_ids=(0x20B710DE,),  # 0x20B710DE: -
        architecture="ampere",
        total_memory_mib=24576,
        memory_slices=4,
        compute_slices=4,
        max_gpu_instances=4,
        min_driver='R460 (>=460.73.01)',
        source='profiles/ids/placements from real `nvidia-smi mig -lgip`/`-lgipp` (driver 535.183.01) + MIG user guide table; GI-id mapping from real -lgi outputs',
        unverified=(),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.6gb", "1_SLICE", 14, 1, 1, 5952, 4, 14, (1, 1, 0, 0, 0), (0, 1, 2, 3), ()),
            _P("1g.6gb+me", "1_SLICE_REV1", 21, 1, 1, 5952, 1, 14, (1, 1, 0, 1, 1), (0, 1, 2, 3), ()),
            _P("2g.12gb", "2_SLICE", 5, 2, 2, 11968, 2, 28, (2, 2, 0, 0, 0), (0, 2), ()),
            _P("2g.12gb+me", "2_SLICE_REV1", 6, 2, 2, 11968, 1, 28, (2, 2, 0, 1, 1), (0, 2), ()),
            _P("4g.24gb", "4_SLICE", 0, 4, 4, 24000, 1, 56, (4, 4, 0, 1, 1), (0,), ()),
        ),
    ),
    _Model(
        name="A100-SXM4-40GB",
        product_names=('NVIDIA A100-SXM4-40GB', 'NVIDIA A100-PCIE-40GB'),
        pci_device_ids=(0x20B010DE, 0x20F110DE, 0x20B110DE, 0x20F610DE,),  # 0x20B010DE: SXM4; 0x20F110DE: PCIe; 0x20B110DE: -; 0x20F610DE: A800-40GB
        architecture="ampere",
        total_memory_mib=40960,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver='R450 (>=450.80.02)',
        source='real `nvidia-smi mig -lgip`/`-lgipp` copies (MIG user guide) ; engine counts from lgip',
        unverified=(),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.5gb", "1_SLICE", 19, 1, 1, 4864, 7, 14, (1, 0, 0, 0, 0), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.5gb+me", "1_SLICE_REV1", 20, 1, 1, 4864, 1, 14, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.10gb", "1_SLICE_REV2", 15, 1, 2, 9856, 4, 14, (1, 1, 0, 0, 0), (0, 2, 4, 6), ()),
            _P("2g.10gb", "2_SLICE", 14, 2, 2, 9856, 3, 28, (2, 1, 0, 0, 0), (0, 2, 4), ()),
            _P("3g.20gb", "3_SLICE", 9, 3, 4, 19968, 2, 42, (3, 2, 0, 0, 0), (0, 4), ()),
            _P("4g.20gb", "4_SLICE", 5, 4, 4, 19968, 1, 56, (4, 2, 0, 0, 0), (0,), ()),
            _P("7g.40gb", "7_SLICE", 0, 7, 8, 40192, 1, 98, (7, 5, 0, 1, 1), (0,), ()),
        ),
    ),
    _Model(
        name="A100-80GB",
        product_names=('NVIDIA A100-SXM4-80GB', 'NVIDIA A100 80GB PCIe'),
        pci_device_ids=(0x20B210DE, 0x20B510DE, 0x20F310DE, 0x20F510DE,),  # 0x20B210DE: SXM4; 0x20B510DE: PCIe; 0x20F310DE: A800-SXM4-80GB; 0x20F510DE: A800 80GB PCIe
        architecture="ampere",
        total_memory_mib=81920,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source='real -lgip outputs (newer driver shows 7g=79.00 GiB, older 78.75); GFD label mig-1g.10gb.memory=9728 on A100-80GB-PCIe',
        unverified=(),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.10gb", "1_SLICE", 19, 1, 1, 9728, 7, 14, (1, 0, 0, 0, 0), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.10gb+me", "1_SLICE_REV1", 20, 1, 1, 9728, 1, 14, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.20gb", "1_SLICE_REV2", 15, 1, 2, 19968, 4, 14, (1, 1, 0, 0, 0), (0, 2, 4, 6), ()),
            _P("2g.20gb", "2_SLICE", 14, 2, 2, 19968, 3, 28, (2, 1, 0, 0, 0), (0, 2, 4), ()),
            _P("3g.40gb", "3_SLICE", 9, 3, 4, 40192, 2, 42, (3, 2, 0, 0, 0), (0, 4), ()),
            _P("4g.40gb", "4_SLICE", 5, 4, 4, 40192, 1, 56, (4, 2, 0, 0, 0), (0,), ()),
            _P("7g.80gb", "7_SLICE", 0, 7, 8, 80896, 1, 98, (7, 5, 0, 1, 1), (0,), ()),
        ),
    ),
    _Model(
        name="H100-80GB",
        product_names=('NVIDIA H100 80GB HBM3', 'NVIDIA H100 PCIe'),
        pci_device_ids=(0x233010DE, 0x233110DE, 0x232210DE, 0x232410DE,),  # 0x233010DE: SXM5; 0x233110DE: PCIe; 0x232210DE: H800 PCIe; 0x232410DE: H800
        architecture="hopper",
        total_memory_mib=81559,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver='R525 (>=525.85.12)',
        source="real `nvidia-smi mig -lgip`/`-lgipp` on 'NVIDIA H100 80GB HBM3' (SXM5); GFD label 1g.10gb.memory=9984, 16 SMs",
        unverified=("sm_count on NVIDIA H100 PCIe",),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.10gb", "1_SLICE", 19, 1, 1, 9984, 7, 16, (1, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.10gb+me", "1_SLICE_REV1", 20, 1, 1, 9984, 1, 16, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.20gb", "1_SLICE_REV2", 15, 1, 2, 20096, 4, 26, (1, 1, 0, 1, 0), (0, 2, 4, 6), ()),
            _P("2g.20gb", "2_SLICE", 14, 2, 2, 20096, 3, 32, (2, 2, 0, 2, 0), (0, 2, 4), ()),
            _P("3g.40gb", "3_SLICE", 9, 3, 4, 40448, 2, 60, (3, 3, 0, 3, 0), (0, 4), ()),
            _P("4g.40gb", "4_SLICE", 5, 4, 4, 40448, 1, 64, (4, 4, 0, 4, 0), (0,), ()),
            _P("7g.80gb", "7_SLICE", 0, 7, 8, 81152, 1, 132, (8, 7, 0, 7, 1), (0,), ()),
        ),
    ),
    _Model(
        name="H100-NVL-94GB",
        product_names=('NVIDIA H100 NVL',),
        pci_device_ids=(0x232110DE, 0x233A10DE,),  # 0x232110DE: -; 0x233A10DE: H800 NVL
        architecture="hopper",
        total_memory_mib=95830,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source="real -lgip (driver 560.35.03) + -lgipp on 'NVIDIA H100 NVL'; other drivers show 10.62/21.50/46.12 GiB",
        unverified=(),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.12gb", "1_SLICE", 19, 1, 1, 11008, 7, 16, (1, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.12gb+me", "1_SLICE_REV1", 20, 1, 1, 11008, 1, 16, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.24gb", "1_SLICE_REV2", 15, 1, 2, 22144, 4, 26, (1, 1, 0, 1, 0), (0, 2, 4, 6), ()),
            _P("2g.24gb", "2_SLICE", 14, 2, 2, 22144, 3, 32, (2, 2, 0, 2, 0), (0, 2, 4), ()),
            _P("3g.47gb", "3_SLICE", 9, 3, 4, 47488, 2, 60, (3, 3, 0, 3, 0), (0, 4), ()),
            _P("4g.47gb", "4_SLICE", 5, 4, 4, 47488, 1, 64, (4, 4, 0, 4, 0), (0,), ()),
            _P("7g.94gb", "7_SLICE", 0, 7, 8, 95360, 1, 132, (8, 7, 0, 7, 1), (0,), ()),
        ),
    ),
    _Model(
        name="H200-141GB",
        product_names=('NVIDIA H200', 'NVIDIA H200 NVL'),
        pci_device_ids=(0x233510DE, 0x233B10DE,),  # 0x233510DE: SXM; 0x233B10DE: NVL
        architecture="hopper",
        total_memory_mib=143771,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver='R550 (>=550.90.07)',
        source="names, counts, engine counts, fractions: MIG user guide 'H200 MIG Profiles' table; mig-parted config; no raw -lgip/-lgipp found. memory_mib estimated (H100-NVL usable ratios x 143771 MiB) except 1g which 3 sources put at ~16.0 GiB; profile ids inferred from Hopper family",
        unverified=('placements',),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.18gb", "1_SLICE", 19, 1, 1, 16384, 7, 16, (1, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'profile_id')),
            _P("1g.18gb+me", "1_SLICE_REV1", 20, 1, 1, 16384, 1, 16, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'profile_id')),
            _P("1g.35gb", "1_SLICE_REV2", 15, 1, 2, 33216, 4, 26, (1, 1, 0, 1, 0), (0, 2, 4, 6), ('memory_mib', 'sm_count', 'profile_id')),
            _P("2g.35gb", "2_SLICE", 14, 2, 2, 33216, 3, 32, (2, 2, 0, 2, 0), (0, 2, 4), ('memory_mib', 'sm_count', 'profile_id')),
            _P("3g.71gb", "3_SLICE", 9, 3, 4, 71232, 2, 60, (3, 3, 0, 3, 0), (0, 4), ('memory_mib', 'sm_count', 'profile_id')),
            _P("4g.71gb", "4_SLICE", 5, 4, 4, 71232, 1, 64, (4, 4, 0, 4, 0), (0,), ('memory_mib', 'sm_count', 'profile_id')),
            _P("7g.141gb", "7_SLICE", 0, 7, 8, 143040, 1, 132, (8, 7, 0, 7, 1), (0,), ('memory_mib', 'sm_count', 'profile_id')),
        ),
    ),
    _Model(
        name="GH200-96GB",
        product_names=('NVIDIA GH200 480GB', 'NVIDIA GH200 120GB'),
        pci_device_ids=(0x234210DE,),  # 0x234210DE: -
        architecture="hopper",
        total_memory_mib=97871,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source='real -lgip on GH200 (a10-cuanschutz01); placements NOT directly observed (inferred = H100 geometry; GI ids 3,4,5 seen for 1g.24gb)',
        unverified=('placements',),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.12gb", "1_SLICE", 19, 1, 1, 11264, 7, 16, (1, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.12gb+me", "1_SLICE_REV1", 20, 1, 1, 11264, 1, 16, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.24gb", "1_SLICE_REV2", 15, 1, 2, 23552, 4, 26, (1, 1, 0, 1, 0), (0, 2, 4, 6), ()),
            _P("2g.24gb", "2_SLICE", 14, 2, 2, 23552, 3, 32, (2, 2, 0, 2, 0), (0, 2, 4), ()),
            _P("3g.48gb", "3_SLICE", 9, 3, 4, 47616, 2, 60, (3, 3, 0, 3, 0), (0, 4), ()),
            _P("4g.48gb", "4_SLICE", 5, 4, 4, 47616, 1, 64, (4, 4, 0, 4, 0), (0,), ()),
            _P("7g.96gb", "7_SLICE", 0, 7, 8, 95232, 1, 132, (8, 7, 0, 7, 1), (0,), ()),
        ),
    ),
    _Model(
        name="GH200-144GB",
        product_names=('NVIDIA GH200 144G HBM3e',),
        pci_device_ids=(0x234810DE,),  # 0x234810DE: -
        architecture="hopper",
        total_memory_mib=146831,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source='profile names and counts only from NVIDIA mig-parted config-default.yaml; everything else inferred',
        unverified=('placements',),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.18gb", "1_SLICE", 19, 1, 1, 16864, 7, 16, (1, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("1g.18gb+me", "1_SLICE_REV1", 20, 1, 1, 16864, 1, 16, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("1g.36gb", "1_SLICE_REV2", 15, 1, 2, 33920, 4, 26, (1, 1, 0, 1, 0), (0, 2, 4, 6), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("2g.36gb", "2_SLICE", 14, 2, 2, 33920, 3, 32, (2, 2, 0, 2, 0), (0, 2, 4), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("3g.72gb", "3_SLICE", 9, 3, 4, 72736, 2, 60, (3, 3, 0, 3, 0), (0, 4), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("4g.72gb", "4_SLICE", 5, 4, 4, 72736, 1, 64, (4, 4, 0, 4, 0), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("7g.144gb", "7_SLICE", 0, 7, 8, 146080, 1, 132, (8, 7, 0, 7, 1), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
        ),
    ),
)
