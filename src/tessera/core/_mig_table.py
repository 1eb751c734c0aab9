"""The one table of GPU models: every MIG-capable card with every profile, its NVML ids, size,
engines and placements (``MODELS``), and the cards without MIG that Tessera shares whole, by MPS
or time-slicing (``WHOLE_GPUS``).

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
    aliases: tuple[str, ...] = ()


class _Model(NamedTuple):
    name: str
    product_names: tuple[str, ...]
    pci_device_ids: tuple[int, ...]
    architecture: str
    compute_capability: tuple[int, int]
    total_memory_mib: int
    memory_slices: int
    compute_slices: int
    max_gpu_instances: int
    min_driver: str | None
    source: str
    unverified: tuple[str, ...]
    profiles: tuple[_P, ...]


_HOPPER_96GB_PROFILES: tuple[_P, ...] = (
    # The H100 with 96 GB: GH200-96GB and H100-96GB (the MIG guide's "H100 96GB product (H100
    # on GH200)" table) share it row for row.
    # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
    # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
    _P("1g.12gb", "1_SLICE", 19, 1, 1, 11264, 7, 16, (1, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ()),
    _P("1g.12gb+me", "1_SLICE_REV1", 20, 1, 1, 11264, 1, 16, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ()),
    _P("1g.24gb", "1_SLICE_REV2", 15, 1, 2, 23552, 4, 26, (1, 1, 0, 1, 0), (0, 2, 4, 6), ()),
    _P("2g.24gb", "2_SLICE", 14, 2, 2, 23552, 3, 32, (2, 2, 0, 2, 0), (0, 2, 4), ()),
    _P("3g.48gb", "3_SLICE", 9, 3, 4, 47616, 2, 60, (3, 3, 0, 3, 0), (0, 4), ()),
    _P("4g.48gb", "4_SLICE", 5, 4, 4, 47616, 1, 64, (4, 4, 0, 4, 0), (0,), ()),
    _P("7g.96gb", "7_SLICE", 0, 7, 8, 95232, 1, 132, (8, 7, 0, 7, 1), (0,), ()),
)

MODELS: tuple[_Model, ...] = (
    _Model(
        name="A30-24GB",
        product_names=('NVIDIA A30',),
        pci_device_ids=(0x20B710DE,),  # 0x20B710DE: -
        architecture="ampere",
        compute_capability=(8, 0),
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
        product_names=('NVIDIA A100-SXM4-40GB', 'NVIDIA A100-PCIE-40GB', 'NVIDIA A800 40GB Active', 'NVIDIA A800-SXM4-40GB'),
        pci_device_ids=(0x20B010DE, 0x20F110DE, 0x20B110DE, 0x20F610DE, 0x20BD10DE,),  # 0x20B010DE: SXM4; 0x20F110DE: PCIe; 0x20B110DE: -; 0x20F610DE: A800 40GB Active; 0x20BD10DE: A800-SXM4-40GB (driver README; not in NVIDIA's mig-parted filters)
        architecture="ampere",
        compute_capability=(8, 0),
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
        product_names=('NVIDIA A100-SXM4-80GB', 'NVIDIA A100 80GB PCIe', 'NVIDIA A800-SXM4-80GB', 'NVIDIA A800 80GB PCIe'),
        pci_device_ids=(0x20B210DE, 0x20B510DE, 0x20F310DE, 0x20F510DE,),  # 0x20B210DE: SXM4; 0x20B510DE: PCIe; 0x20F310DE: A800-SXM4-80GB; 0x20F510DE: A800 80GB PCIe
        architecture="ampere",
        compute_capability=(8, 0),
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
        product_names=('NVIDIA H100 80GB HBM3', 'NVIDIA H100 PCIe', 'NVIDIA H800 PCIe', 'NVIDIA H800'),
        pci_device_ids=(0x233010DE, 0x233110DE, 0x232210DE, 0x232410DE,),  # 0x233010DE: SXM5; 0x233110DE: PCIe; 0x232210DE: H800 PCIe; 0x232410DE: H800
        architecture="hopper",
        compute_capability=(9, 0),
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
        product_names=('NVIDIA H100 NVL', 'NVIDIA H800 NVL'),
        pci_device_ids=(0x232110DE, 0x233A10DE,),  # 0x232110DE: -; 0x233A10DE: H800 NVL
        architecture="hopper",
        compute_capability=(9, 0),
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
        compute_capability=(9, 0),
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
        compute_capability=(9, 0),
        total_memory_mib=97871,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source='real -lgip on GH200 (a10-cuanschutz01); placements NOT directly observed (inferred = H100 geometry; GI ids 3,4,5 seen for 1g.24gb)',
        unverified=('placements',),
        profiles=_HOPPER_96GB_PROFILES,
    ),
    _Model(
        name="GH200-144GB",
        product_names=('NVIDIA GH200 144G HBM3e',),
        pci_device_ids=(0x234810DE,),  # 0x234810DE: -
        architecture="hopper",
        compute_capability=(9, 0),
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
    _Model(
        name="H100-96GB",
        product_names=('NVIDIA H100 96GB HBM3',),
        pci_device_ids=(0x233D10DE,),  # 0x233D10DE: H100 96GB (pci.ids; grouped with GH200 in NVIDIA's mig-parted filters)
        architecture="hopper",
        compute_capability=(9, 0),
        total_memory_mib=97871,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source="MIG user guide table 'H100 96GB product (H100 on GH200)': the GH200-96GB geometry; memory/SMs/engines from the GH200 -lgip; product name not published (PCI id from pci.ids and the GPU Operator's filter)",
        unverified=('placements', 'product_names'),
        profiles=_HOPPER_96GB_PROFILES,
    ),
    _Model(
        name="PG506-96GB",
        product_names=('NVIDIA PG506-232',),
        pci_device_ids=(0x20B610DE,),  # 0x20B610DE: GA100 PG506-232 (NVIDIA mig-parted 65c4086c 'PG506-96GB')
        architecture="ampere",
        compute_capability=(8, 0),
        total_memory_mib=98304,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source="an A100 (GA100) board with 96 GB: profile names and counts from NVIDIA mig-parted's default config (2021); SMs, engines, ids and placements as on the A100-80GB; memory scaled from the A100-80GB by the names' 96 GiB total",
        unverified=('placements', 'total_memory_mib'),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.12gb", "1_SLICE", 19, 1, 1, 11648, 7, 14, (1, 0, 0, 0, 0), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'profile_id')),
            _P("1g.12gb+me", "1_SLICE_REV1", 20, 1, 1, 11648, 1, 14, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'profile_id')),
            _P("1g.24gb", "1_SLICE_REV2", 15, 1, 2, 23936, 4, 14, (1, 1, 0, 0, 0), (0, 2, 4, 6), ('memory_mib', 'profile_id')),
            _P("2g.24gb", "2_SLICE", 14, 2, 2, 23936, 3, 28, (2, 1, 0, 0, 0), (0, 2, 4), ('memory_mib', 'profile_id')),
            _P("3g.48gb", "3_SLICE", 9, 3, 4, 48192, 2, 42, (3, 2, 0, 0, 0), (0, 4), ('memory_mib', 'profile_id')),
            _P("4g.48gb", "4_SLICE", 5, 4, 4, 48192, 1, 56, (4, 2, 0, 0, 0), (0,), ('memory_mib', 'profile_id')),
            _P("7g.96gb", "7_SLICE", 0, 7, 8, 97024, 1, 98, (7, 5, 0, 1, 1), (0,), ('memory_mib', 'profile_id')),
        ),
    ),
    _Model(
        name="H20-96GB",
        product_names=('NVIDIA H20',),
        pci_device_ids=(0x232910DE,),  # 0x232910DE: H20 (driver README)
        architecture="hopper",
        compute_capability=(9, 0),
        total_memory_mib=97871,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source="names and counts: NVIDIA vGPU 'H20 SXM5 96GB' MIG table and the GPU Operator's config; 1g.12gb (id 19, 11.75 GiB, 8 SMs, 1 NVDEC) from a driver 535.247.01 -lgip transcript; the rest inferred: Hopper ids and placements, memory as 2x/4x/8x the 1g, SMs 8 per compute slice and 78 for the whole card, Hopper engines; total memory from a test capture",
        unverified=('placements', 'total_memory_mib'),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.12gb", "1_SLICE", 19, 1, 1, 12032, 7, 8, (1, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ('engines',)),
            _P("1g.12gb+me", "1_SLICE_REV1", 20, 1, 1, 12032, 1, 8, (1, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ('engines',)),
            _P("1g.24gb", "1_SLICE_REV2", 15, 1, 2, 24064, 4, 8, (1, 1, 0, 1, 0), (0, 2, 4, 6), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("2g.24gb", "2_SLICE", 14, 2, 2, 24064, 3, 16, (2, 2, 0, 2, 0), (0, 2, 4), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("3g.48gb", "3_SLICE", 9, 3, 4, 48128, 2, 24, (3, 3, 0, 3, 0), (0, 4), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("4g.48gb", "4_SLICE", 5, 4, 4, 48128, 1, 32, (4, 4, 0, 4, 0), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("7g.96gb", "7_SLICE", 0, 7, 8, 96256, 1, 78, (8, 7, 0, 7, 1), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
        ),
    ),
    _Model(
        name="B200-180GB",
        product_names=('NVIDIA B200',),
        pci_device_ids=(0x290110DE,),  # 0x290110DE: B200 (driver README)
        architecture="blackwell",
        compute_capability=(10, 0),
        total_memory_mib=183359,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver='R570 (>=570.133.20)',
        source="MIG user guide 'B200 MIG Profiles' table (counts, CE); -lgip rows 1g..2g from NVIDIA's GPU Operator PRs #1242/#1351 (driver of 2025-03: 1g = 20.50 GiB, 22.00 before); 3g/4g/7g memory and SMs from a third-party -lgip; total memory from a real nvidia-smi -q capture (driver 580.105.08); ids 9/5/0 and placements as on every Hopper card; media engines of 3g/4g/7g by the Hopper rule (one NVDEC and JPEG per compute slice)",
        unverified=('placements',),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.23gb", "1_SLICE", 19, 1, 1, 20992, 7, 18, (2, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.23gb+me", "1_SLICE_REV1", 20, 1, 1, 20992, 1, 18, (2, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ()),
            _P("1g.45gb", "1_SLICE_REV2", 15, 1, 2, 45312, 4, 30, (2, 1, 0, 1, 0), (0, 2, 4, 6), ()),
            _P("2g.45gb", "2_SLICE", 14, 2, 2, 45312, 3, 36, (4, 2, 0, 2, 0), (0, 2, 4), ()),
            _P("3g.90gb", "3_SLICE", 9, 3, 4, 91136, 2, 70, (6, 3, 0, 3, 0), (0, 4), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("4g.90gb", "4_SLICE", 5, 4, 4, 91136, 1, 72, (8, 4, 0, 4, 0), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("7g.180gb", "7_SLICE", 0, 7, 8, 182784, 1, 148, (16, 7, 0, 7, 1), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
        ),
    ),
    _Model(
        name="GB200-186GB",
        product_names=('NVIDIA GB200',),
        pci_device_ids=(0x294110DE,),  # 0x294110DE: GB200 (driver README)
        architecture="blackwell",
        compute_capability=(10, 0),
        total_memory_mib=189471,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source="-lgip rows 1g..2g from NVIDIA mig-parted issue #227 (2025-08); counts from the GPU Operator's config; total memory from a real nvidia-smi -q capture (driver 580.173.02); 3g/4g/7g memory as on the B200 (2x and 4x the 2g plus the same reserve), SMs and engines as the B200 (same GB100 die), ids and placements as on Hopper. Aliases: an earlier driver reported 189 GiB in total, which names the same profiles 1g.24gb, 3g.95gb, 4g.95gb and 7g.189gb (NVIDIA's config still holds those)",
        unverified=('placements',),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.23gb", "1_SLICE", 19, 1, 1, 22528, 7, 18, (2, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), (), ('1g.24gb',)),
            _P("1g.23gb+me", "1_SLICE_REV1", 20, 1, 1, 22528, 1, 18, (2, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), (), ('1g.24gb+me',)),
            _P("1g.47gb", "1_SLICE_REV2", 15, 1, 2, 46592, 4, 32, (2, 1, 0, 1, 0), (0, 2, 4, 6), ()),
            _P("2g.47gb", "2_SLICE", 14, 2, 2, 46592, 3, 38, (4, 2, 0, 2, 0), (0, 2, 4), ()),
            _P("3g.93gb", "3_SLICE", 9, 3, 4, 93696, 2, 70, (6, 3, 0, 3, 0), (0, 4), ('memory_mib', 'sm_count', 'profile_id', 'engines'), ('3g.95gb',)),
            _P("4g.93gb", "4_SLICE", 5, 4, 4, 93696, 1, 72, (8, 4, 0, 4, 0), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines'), ('4g.95gb',)),
            _P("7g.186gb", "7_SLICE", 0, 7, 8, 187904, 1, 148, (16, 7, 0, 7, 1), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines'), ('7g.189gb',)),
        ),
    ),
    _Model(
        name="B300-269GB",
        product_names=('NVIDIA B300 SXM6 AC',),
        pci_device_ids=(0x318210DE,),  # 0x318210DE: B300 SXM6 AC (driver README)
        architecture="blackwell",
        compute_capability=(10, 3),
        total_memory_mib=275200,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source="profile names and counts from the GPU Operator's config (2025-10); everything else inferred: total memory inside the 269 GiB the names imply, memory per profile at the B200's ratios, SMs and engines as the B200, ids and placements as on Hopper",
        unverified=('placements', 'total_memory_mib'),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.34gb", "1_SLICE", 19, 1, 1, 31488, 7, 18, (2, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("1g.34gb+me", "1_SLICE_REV1", 20, 1, 1, 31488, 1, 18, (2, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("1g.67gb", "1_SLICE_REV2", 15, 1, 2, 67968, 4, 30, (2, 1, 0, 1, 0), (0, 2, 4, 6), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("2g.67gb", "2_SLICE", 14, 2, 2, 67968, 3, 36, (4, 2, 0, 2, 0), (0, 2, 4), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("3g.135gb", "3_SLICE", 9, 3, 4, 136768, 2, 70, (6, 3, 0, 3, 0), (0, 4), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("4g.135gb", "4_SLICE", 5, 4, 4, 136768, 1, 72, (8, 4, 0, 4, 0), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
            _P("7g.269gb", "7_SLICE", 0, 7, 8, 274304, 1, 148, (16, 7, 0, 7, 1), (0,), ('memory_mib', 'sm_count', 'profile_id', 'engines')),
        ),
    ),
    _Model(
        name="GB300-278GB",
        product_names=('NVIDIA GB300',),
        pci_device_ids=(0x31C210DE,),  # 0x31C210DE: GB300 (driver README)
        architecture="blackwell",
        compute_capability=(10, 3),
        total_memory_mib=284208,
        memory_slices=8,
        compute_slices=7,
        max_gpu_instances=7,
        min_driver=None,
        source="names, counts and profile ids from NVIDIA's 'MIG on DGX Station' playbook and the GPU Operator's config; total memory from a real nvidia-smi -q capture (driver 580.173.02); memory per profile at the B200's ratios, SMs and engines as the B200, placements as on Hopper (all inferred)",
        unverified=('placements',),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.35gb", "1_SLICE", 19, 1, 1, 32512, 7, 18, (2, 1, 0, 1, 0), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'sm_count', 'engines')),
            _P("1g.35gb+me", "1_SLICE_REV1", 20, 1, 1, 32512, 1, 18, (2, 1, 0, 1, 1), (0, 1, 2, 3, 4, 5, 6), ('memory_mib', 'sm_count', 'engines')),
            _P("1g.70gb", "1_SLICE_REV2", 15, 1, 2, 70208, 4, 30, (2, 1, 0, 1, 0), (0, 2, 4, 6), ('memory_mib', 'sm_count', 'engines')),
            _P("2g.70gb", "2_SLICE", 14, 2, 2, 70208, 3, 36, (4, 2, 0, 2, 0), (0, 2, 4), ('memory_mib', 'sm_count', 'engines')),
            _P("3g.139gb", "3_SLICE", 9, 3, 4, 141248, 2, 70, (6, 3, 0, 3, 0), (0, 4), ('memory_mib', 'sm_count', 'engines')),
            _P("4g.139gb", "4_SLICE", 5, 4, 4, 141248, 1, 72, (8, 4, 0, 4, 0), (0,), ('memory_mib', 'sm_count', 'engines')),
            _P("7g.278gb", "7_SLICE", 0, 7, 8, 283264, 1, 148, (16, 7, 0, 7, 1), (0,), ('memory_mib', 'sm_count', 'engines')),
        ),
    ),
    _Model(
        name="RTX-PRO-6000-96GB",
        product_names=('NVIDIA RTX PRO 6000 Blackwell Server Edition', 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition', 'NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition'),
        pci_device_ids=(0x2BB510DE, 0x2BB110DE, 0x2BB410DE,),  # 0x2BB510DE: Server Edition; 0x2BB110DE: Workstation Edition; 0x2BB410DE: Max-Q Workstation Edition (lspci)
        architecture="blackwell",
        compute_capability=(12, 0),
        total_memory_mib=97887,
        memory_slices=12,
        compute_slices=4,
        max_gpu_instances=4,
        min_driver='R575 (>=575.51.03)',
        source="MIG user guide 'RTX PRO 6000' table (one table for all three editions: counts, engines, +gfx/+me.all/-me); real -lgip on Server (driver 610.43.02), Max-Q (580.105.08) and two more hosts agree on ids, SMs and engines; real -lgipp (610.43.02): placements on a 12-unit grid, 1g = 3 units; 4g memory 97408 MiB on 610 (97280 on 580); GI ids 3..6 for the four 1g, 1 for the 2g at 0 (observed); the NVML constant of each +gfx/+me.all/-me profile follows go-nvlib's naming (no transcript prints constant and id together)",
        unverified=(),
        profiles=(
            # name, NVML constant, profile id, compute slices, memory slices, MiB, max count, SMs,
            # engines (CE, DEC, ENC, JPEG, OFA), placement starts, unverified fields
            _P("1g.24gb", "1_SLICE", 14, 1, 3, 24192, 4, 46, (1, 1, 1, 1, 0), (0, 3, 6, 9), ()),
            _P("1g.24gb+me", "1_SLICE_REV1", 21, 1, 3, 24192, 1, 46, (1, 1, 1, 1, 1), (0, 3, 6, 9), ()),
            _P("1g.24gb+gfx", "1_SLICE_GFX", 47, 1, 3, 24192, 4, 46, (1, 1, 1, 1, 0), (0, 3, 6, 9), ('nvml_constant',)),
            _P("1g.24gb+me.all", "1_SLICE_ALL_ME", 65, 1, 3, 24192, 1, 46, (1, 4, 4, 4, 1), (0, 3, 6, 9), ('nvml_constant',)),
            _P("1g.24gb-me", "1_SLICE_NO_ME", 67, 1, 3, 24192, 4, 46, (1, 0, 0, 0, 0), (0, 3, 6, 9), ('nvml_constant',)),
            _P("2g.48gb", "2_SLICE", 5, 2, 6, 48512, 2, 94, (2, 2, 2, 2, 0), (0, 6), ()),
            _P("2g.48gb+gfx", "2_SLICE_GFX", 35, 2, 6, 48512, 2, 94, (2, 2, 2, 2, 0), (0, 6), ('nvml_constant',)),
            _P("2g.48gb+me.all", "2_SLICE_ALL_ME", 64, 2, 6, 48512, 1, 94, (2, 4, 4, 4, 1), (0, 6), ('nvml_constant',)),
            _P("2g.48gb-me", "2_SLICE_NO_ME", 66, 2, 6, 48512, 2, 94, (2, 0, 0, 0, 0), (0, 6), ('nvml_constant',)),
            _P("4g.96gb", "4_SLICE", 0, 4, 12, 97408, 1, 188, (4, 4, 4, 4, 1), (0,), ()),
            _P("4g.96gb+gfx", "4_SLICE_GFX", 32, 4, 12, 97408, 1, 188, (4, 4, 4, 4, 1), (0,), ('nvml_constant',)),
        ),
    ),
)


class _Whole(NamedTuple):
    name: str
    product_names: tuple[str, ...]
    pci_device_ids: tuple[int, ...]
    architecture: str
    compute_capability: tuple[int, int]
    total_memory_mib: int
    source: str
    unverified: tuple[str, ...]


WHOLE_SOURCE = ("real nvidia-smi transcripts (driver 5xx+, ECC on; R470 and ECC off report other "
                "totals); PCI ids from NVIDIA's driver README (595.45.04) or pci.ids")

WHOLE_GPUS: tuple[_Whole, ...] = (
    # name, NVML product names, PCI device ids, architecture, CUDA compute capability, memory MiB
    # as nvidia-smi totals it,
    # source, unverified fields
    _Whole("T4-16GB", ("Tesla T4",), (0x1EB810DE,), "turing", (7, 5), 15360, WHOLE_SOURCE, ()),
    _Whole("L4-24GB", ("NVIDIA L4",), (0x27B810DE,), "ada", (8, 9), 23034, WHOLE_SOURCE, ()),
    _Whole("A10-24GB", ("NVIDIA A10",), (0x223610DE,), "ampere", (8, 6), 23028, WHOLE_SOURCE, ()),
    _Whole("A10G-24GB", ("NVIDIA A10G",), (0x223710DE,), "ampere", (8, 6), 23028, WHOLE_SOURCE, ()),
    _Whole("L40S-48GB", ("NVIDIA L40S",), (0x26B910DE,), "ada", (8, 9), 46068, WHOLE_SOURCE, ()),
    _Whole("L40-48GB", ("NVIDIA L40",), (0x26B510DE,), "ada", (8, 9), 46068, WHOLE_SOURCE, ()),
    _Whole("A40-48GB", ("NVIDIA A40",), (0x223510DE,), "ampere", (8, 6), 46068, WHOLE_SOURCE, ()),
    _Whole("V100-16GB", ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"), (0x1DB110DE, 0x1DB410DE, 0x1DF510DE), "volta", (7, 0), 16384, WHOLE_SOURCE, ()),
    _Whole("V100-32GB", ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB"), (0x1DB510DE, 0x1DB610DE), "volta", (7, 0), 32768, WHOLE_SOURCE, ()),
)
