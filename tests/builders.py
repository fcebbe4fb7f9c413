"""Builders of test inputs shared by the test modules: plain functions, no fixtures.

``cpuinfo(kind)``: /proc/cpuinfo texts of real machines (copied from the devices, serials
scrambled), the one table every cpuinfo test reads.
"""

from __future__ import annotations

_ARM_BLOCK = """\
processor\t: {n}
BogoMIPS\t: 108.00
Features\t: {features}
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x{variant}
CPU part\t: {part}
CPU revision\t: {rev}

"""

_A76_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"


def arm_cpuinfo(features: str, parts: list[str], variant: str = "0", rev: str = "1", tail: str = "") -> str:
    """An arm64 kernel's /proc/cpuinfo: one block per core (``parts``: "CPU part" of each), then ``tail``."""
    blocks = [_ARM_BLOCK.format(n=i, features=features, part=p, variant=variant, rev=rev) for i, p in enumerate(parts)]
    return "".join(blocks) + tail


def _x86(model: str, flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: {model}\nflags\t\t: {flags}\n"


_CPUINFO = {
    # Raspberry Pi 4 (BCM2711, 4x Cortex-A72: NEON, no dot product), 64-bit OS
    "rpi4": lambda: arm_cpuinfo(
        "fp asimd evtstrm crc32 cpuid", ["0xd08"] * 4, rev="3",
        tail="Hardware\t: BCM2835\nRevision\t: c03114\nSerial\t\t: 100000002b3e1c4a\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n",
    ),
    # the same board under a 32-bit Raspberry Pi OS: armv7 words, "neon" instead of "asimd"
    "rpi4-32bit": lambda: """\
processor\t: 0
model name\t: ARMv7 Processor rev 3 (v7l)
BogoMIPS\t: 108.00
Features\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32
CPU implementer\t: 0x41
CPU architecture: 7
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
""",
    # Raspberry Pi 5 (BCM2712, 4x Cortex-A76: asimddp, asimdhp)
    "rpi5": lambda: arm_cpuinfo(
        _A76_FEATURES, ["0xd0b"] * 4, variant="4",
        tail="Revision\t: d04170\nSerial\t\t: 3b4a1f0e2c9d8a71\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n",
    ),
    # Jetson Orin Nano (6x Cortex-A78AE)
    "jetson-orin": lambda: arm_cpuinfo(_A76_FEATURES + " uscat ilrcpc flagm paca pacg", ["0xd42"] * 6),
    # Jetson Nano (4x Cortex-A57)
    "jetson-nano": lambda: arm_cpuinfo("fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid", ["0xd07"] * 4, variant="1", rev="1"),
    # RK3588 (4x Cortex-A55 + 4x Cortex-A76, big.LITTLE)
    "rk3588": lambda: arm_cpuinfo(_A76_FEATURES, ["0xd05"] * 4 + ["0xd0b"] * 4),
    # Xeon E5-2686 v4 (Broadwell): AVX2, no AVX-512
    "x86-avx2": lambda: _x86(
        "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz",
        "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
        "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf "
        "tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer "
        "aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch cpuid_fault invpcid_single pti fsgsbase "
        "bmi1 hle avx2 smep bmi2 erms invpcid rtm rdseed adx xsaveopt",
    ),
    # Xeon Platinum 8259CL (Cascade Lake): AVX-512 with VNNI
    "x86-avx512-vnni": lambda: _x86(
        "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz",
        "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht "
        "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf "
        "tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer "
        "aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch invpcid_single pti fsgsbase tsc_adjust "
        "bmi1 avx2 smep bmi2 erms invpcid mpx avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw "
        "avx512vl xsaveopt xsavec xgetbv1 xsaves ida arat pku ospke avx512_vnni",
    ),
    # Core Ultra 7 155H (Meteor Lake): AVX2 with AVX-VNNI, no AVX-512
    "x86-avx-vnni": lambda: _x86(
        "Intel(R) Core(TM) Ultra 7 155H",
        "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse sse2 "
        "ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl xtopology "
        "nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg "
        "fma cx16 xtpr pdcm sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm "
        "abm 3dnowprefetch cpuid_fault epb intel_ppin ssbd ibrs ibpb stibp ibrs_enhanced tpr_shadow flexpriority ept "
        "vpid ept_ad fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdt_a rdseed adx smap clflushopt clwb "
        "intel_pt sha_ni xsaveopt xsavec xgetbv1 xsaves split_lock_detect avx_vnni dtherm ida arat pln pts hwp "
        "hwp_notify hwp_act_window hwp_epp hwp_pkg_req hfi vnmi umip pku ospke waitpkg gfni vaes vpclmulqdq rdpid "
        "bus_lock_detect movdiri movdir64b fsrm md_clear serialize arch_lbr ibt flush_l1d arch_capabilities",
    ),
}

CPUINFO_KINDS = tuple(_CPUINFO)


def cpuinfo(kind: str) -> str:
    """/proc/cpuinfo of a real machine of ``kind`` (one of ``CPUINFO_KINDS``)."""
    return _CPUINFO[kind]()
