"""`python -m specviz.bench.floors`: the machine's memory and multiply-add limits, each instruction set this CPU has."""
from specviz.bench import floors
from specviz.cpu import cpu_info


def test_the_floors_are_measured_for_each_instruction_set_this_cpu_has():
    measured = floors.measure()
    simd = set(cpu_info()[1])
    assert measured["read_bytes_per_s"] > 1e9 and measured["avx2_macs_per_s"] > 1e9
    assert ("avx512_vnni_macs_per_s" in measured) == ("avx512_vnni" in simd)
    if "amx_macs_per_s" in measured:        # where the CPU has the tiles and the OS lets the process use them
        assert {"amx_tile", "amx_int8"} <= simd and measured["amx_macs_per_s"] > measured["avx2_macs_per_s"]
    model = floors.file_floors("qwen2.5-coder-1.5b", measured)       # the offline 1.5B's layers
    fastest = max(v for k, v in measured.items() if k.endswith("macs_per_s"))
    assert 0.7e9 < model["layer_bytes"] < 0.9e9 and 1.2e9 < model["macs_per_row"] < 1.4e9
    assert model["extra_row_floor_ms"] == 1e3 * model["macs_per_row"] / fastest
    assert model["one_token_floor_ms"] == 1e3 * model["layer_bytes"] / measured["read_bytes_per_s"]
