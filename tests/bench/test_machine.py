"""bench.common.cpu_description: the history tells CPUs of one model name apart."""

from bench.common import cpu_description

EPYC_AVX512 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni

processor\t: 1
cpu family\t: 99
model name\t: something else
"""

XEON_AMX = """cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8
"""


def test_family_model_and_vector_instructions_are_named():
    assert cpu_description(EPYC_AVX512) == "AMD EPYC (family 25, model 17; AVX2, AVX-512, bf16, VNNI)"
    assert cpu_description(XEON_AMX) == (
        "Intel(R) Xeon(R) Platinum 8480+ (family 6, model 143; AVX2, AVX-512, bf16, VNNI, AMX)")


def test_only_the_first_processor_is_read():
    assert "99" not in cpu_description(EPYC_AVX512)


def test_an_arm_cpuinfo_without_those_fields_keeps_what_it_has():
    described = cpu_description("processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n")
    assert "family" not in described and "AVX" not in described and described
