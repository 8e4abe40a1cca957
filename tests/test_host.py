"""fkjax.host: the host CPU as results name it."""
import jax
import pytest

from fkjax.training import devices  # pylint: disable=import-outside-toplevel
from fkjax import host

_X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme sse2 avx fma avx2 bmi2{extra}

processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu vme sse2 avx fma avx2 bmi2{extra}
"""


@pytest.mark.parametrize("extra, isa", [(" avx512f avx512bw", "AVX-512"),
                                        ("", "AVX2")])
def test_an_x86_cpu_is_named_with_its_widest_vector_extension(extra, isa):
  text = _X86.format(extra=extra)
  assert host.describe_cpu(text, cores=2) == f"AMD EPYC, 2 cores, {isa}"
  label = f"1 x cpu (cpu), jax 0.10.2; {host.describe_cpu(text, cores=2)}"
  assert host.isa_of(label) == isa


def test_an_x86_cpu_without_avx2_says_so():
  text = _X86.format(extra="").replace(" avx2", "")
  assert host.describe_cpu(text, cores=1) == "AMD EPYC, 1 core, no AVX2"


def test_a_cpu_without_x86_flags_is_named_without_an_instruction_set():
  arm = "processor\t: 0\nFeatures\t: fp asimd\nCPU part\t: 0xd0c\n"
  name = host.describe_cpu(arm, cores=4)
  assert name.endswith(", 4 cores") and name.count(",") >= 1
  assert host.isa_of(f"1 x cpu (cpu), jax 0.10.2; {name}") is None


def test_the_device_label_names_the_host_cpu_on_cpu():
  label = devices.describe_devices(1)
  if jax.devices()[0].platform != "cpu":
    pytest.skip("not a CPU backend")
  prefix, _, cpu = label.partition("; ")
  assert prefix == f"1 x cpu (cpu), jax {jax.__version__}"
  assert cpu == host.describe_cpu()
  assert host.isa_of(label) == (cpu.rsplit(", ", 1)[-1]
                                if cpu.rsplit(", ", 1)[-1] in host.ISAS
                                else None)
