"""The offer search of the vast.ai fake (tests/fakes/vastai.py): its catalog of offers, and the filters
of `POST /api/v0/bundles/` checked against vast.ai's documented fields and operators, then applied."""

from __future__ import annotations

from typing import Any

OFFER_KEYS = (
    "id", "gpu_name", "num_gpus", "dph_total", "min_bid", "gpu_ram", "cpu_cores_effective", "cpu_ram",
    "inet_down", "inet_up", "disk_space", "reliability2", "verified", "hosting_type", "cuda_max_good",
    "score", "geolocation",
)  # fmt: skip
OFFER_ROWS = [
    (1001, "RTX A5000", 1, 0.18, 0.09, 24564, 8.0, 32000, 900, 400, 120, 0.991, True, 0, 12.4, 86, "CZ"),
    (1002, "RTX A6000", 1, 0.42, 0.21, 49140, 12.0, 64000, 2500, 900, 250, 0.995, True, 1, 12.4, 91, "US"),
    (1003, "RTX A6000", 2, 0.80, 0.40, 49140, 24.0, 128000, 3000, 1200, 500, 0.989, True, 1, 12.2, 88, "DE"),
    (1004, "RTX 4090", 1, 0.35, 0.17, 24564, 16.0, 64000, 1800, 700, 200, 0.978, True, 0, 12.4, 93, "SE"),
    (1005, "RTX 4090", 1, 0.29, 0.14, 24564, 8.0, 32000, 600, 300, 100, 0.952, False, 0, 12.2, 70, "BR"),
    (1006, "A100 PCIE", 1, 1.10, 0.55, 81920, 32.0, 256000, 5000, 5000, 1000, 0.998, True, 1, 12.4, 97, "US"),
    (1007, "RTX 3090", 1, 0.16, 0.08, 24576, 6.0, 32000, 500, 200, 80, 0.970, True, 0, 12.0, 80, "PL"),
    (1008, "RTX 4090", 4, 1.30, 0.64, 24564, 64.0, 256000, 4000, 2000, 800, 0.993, True, 1, 12.4, 95, "US"),
]
SEARCH_META = {"order", "type", "limit", "allocated_storage", "disable_bundling"}


def _coerce(want: Any, have: Any) -> Any:
    """The filter value in the type of the offer's field (the library sends numbers as strings)."""
    if isinstance(have, bool):
        return want if isinstance(want, bool) else str(want).lower() in ("true", "1")
    if isinstance(have, int | float):
        return float(want)
    return str(want)


# The search fields vast.ai documents (`vastai search offers --help`; vastai 1.9.1's api/query.py), and the
# operators of its filters. A filter on any other field, or with another operator, is an error here: the
# server is not known to refuse it (the client's query parser only warns), but a filter a test cannot see
# working is how `reliability` and `datacenter` once filtered nothing in every test.
SEARCH_FIELDS = frozenset((
    "bw_nvlink", "compute_cap", "cpu_arch", "cpu_cores", "cpu_cores_effective", "cpu_ghz", "cpu_ram",
    "cuda_max_good", "datacenter", "direct_port_count", "driver_version", "disk_bw", "disk_space", "dlperf",
    "dlperf_per_dphtotal", "dph_total", "duration", "external", "flops_per_dphtotal", "gpu_arch",
    "gpu_display_active", "gpu_frac", "gpu_mem_bw", "gpu_name", "gpu_ram", "gpu_total_ram", "gpu_max_power",
    "gpu_max_temp", "has_avx", "host_id", "id", "inet_down", "inet_down_cost", "inet_up", "inet_up_cost",
    "machine_id", "min_bid", "mobo_name", "num_gpus", "pci_gen", "pcie_bw", "reliability", "rentable",
    "rented", "storage_cost", "static_ip", "total_flops", "ubuntu_version", "verification", "verified",
    "vms_enabled", "geolocation", "cluster_id",
))  # fmt: skip
OPERATORS = frozenset({"eq", "neq", "lt", "lte", "gt", "gte", "in", "notin"})
# Fields a search filters on that an offer row shows under another name: `reliability` is the row's
# `reliability2`, `datacenter` a host whose `hosting_type` is 1.
_DERIVED = {
    "reliability": lambda row: row.get("reliability2"),
    "datacenter": lambda row: row.get("hosting_type") == 1,
}


class BadFilter(ValueError):
    """A search filter the fake refuses (answered 400 invalid_args, naming it)."""


def check_filters(filters: dict[str, Any]) -> None:
    """BadFilter for a field vast.ai does not document, a filter that is not `{op: value}`, or an operator
    it does not have."""
    for key, conds in filters.items():
        if key in SEARCH_META:
            continue
        if key not in SEARCH_FIELDS:
            raise BadFilter(f"unknown search field {key!r}")
        if not isinstance(conds, dict) or not conds:
            raise BadFilter(f'filter {key!r} must be an object of operators, e.g. {{"eq": 1}}')
        unknown = sorted(set(conds) - OPERATORS)
        if unknown:
            raise BadFilter(f"unknown operator {unknown[0]!r} in filter {key!r}")


def _value(row: dict[str, Any], key: str) -> Any:
    if key in _DERIVED:
        return _DERIVED[key](row)
    if key not in row:  # a documented field this fake's rows lack: loud, never a silent pass
        raise BadFilter(f"the fake's offers have no {key!r}; add it to its rows to filter on it")
    return row[key]


def matches(row: dict[str, Any], filters: dict[str, Any]) -> bool:
    """Whether a row passes every `{field: {op: value}}` filter (check_filters first)."""
    for key, conds in filters.items():
        if key in SEARCH_META:
            continue
        have = _value(row, key)
        for op, want in conds.items():
            if op in ("in", "notin"):
                found = have in [_coerce(w, have) for w in want]
                ok = found if op == "in" else not found
            elif have is None:
                ok = op == "eq" and want is None
            else:
                value = _coerce(want, have)
                ok = {
                    "eq": have == value,
                    "neq": have != value,
                    "lt": have < value,
                    "lte": have <= value,
                    "gt": have > value,
                    "gte": have >= value,
                }[op]
            if not ok:
                return False
    return True


def sort_key(row: dict[str, Any], key: str) -> float:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) else 0.0
