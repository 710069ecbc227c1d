"""Quantities with their unit: each conversion against its definition (SI powers of ten, IEC powers
of two), and every refusal one line naming the key."""

import pytest

from zbopt.core.errors import ZboptError
from zbopt.core.units import parse_flops, parse_memory, parse_time


@pytest.mark.parametrize(("text", "ms"), [("1.7 ms", 1.7), ("2 s", 2000.0), ("250us", 0.25), ("3e-1 s", 300.0),
                                          (" 0 ms ", 0.0), ("1.5 µs", 0.0015)])
def test_times_convert_to_milliseconds(text, ms):
    assert parse_time(text, "forward") == pytest.approx(ms, rel=1e-12)


@pytest.mark.parametrize(("text", "gb"), [
    ("80 GB", 80.0), ("1 GiB", 1.073741824), ("80 GiB", 85.89934592),  # 2^30 bytes, 7.4% over a GB
    ("512 MB", 0.512), ("512 MiB", 0.536870912), ("1 TB", 1000.0), ("1 TiB", 1099.511627776),
    ("1000000000 B", 1.0), ("4 KiB", 4.096e-6)])
def test_memory_converts_to_gigabytes_of_ten_to_the_ninth_bytes(text, gb):
    assert parse_memory(text, "activation") == pytest.approx(gb, rel=1e-12)


@pytest.mark.parametrize(("text", "flops"), [("400 TFLOPS", 4e14), ("1 PFLOP/s", 1e15), ("989.5 TFLOP/s", 9.895e14),
                                             ("5 GFLOPS", 5e9), ("7 FLOPS", 7.0)])
def test_compute_rates_convert_to_flop_per_second(text, flops):
    assert parse_flops(text, "flops") == pytest.approx(flops, rel=1e-12)


@pytest.mark.parametrize(("parse", "value", "message"), [
    (parse_time, 1.7, "key = 1.7: write the unit, e.g. '1.7 ms'"),
    (parse_time, "1.7", "key = '1.7': write the unit, e.g. '1.7 ms'"),
    (parse_memory, 80, "key = 80: write the unit, e.g. '80 GB'"),
    (parse_time, "1.7 min", "key = '1.7 min': unknown unit 'min' (known: ms, s, us, µs)"),
    (parse_memory, "80 gb", "key = '80 gb': unknown unit 'gb' (known: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"),
    (parse_time, "-1 ms", "key = '-1 ms': a time cannot be negative"),
    (parse_memory, "-0.5 GB", "key = '-0.5 GB': a memory cannot be negative"),
    (parse_time, "1e999 ms", "key = '1e999 ms': not a finite time"),
    (parse_time, "fast", "key = 'fast': expected a time with its unit, e.g. '1.7 ms'"),
    (parse_time, True, "key = True: expected a time with its unit, e.g. '1.7 ms'"),
    (parse_memory, ["80 GB"], "key = ['80 GB']: expected a memory with its unit, e.g. '80 GB'"),
    (parse_flops, "0 TFLOPS", "key = '0 TFLOPS': must be more than 0"),
])
def test_every_mistake_is_one_line_naming_the_key_and_value(parse, value, message):
    with pytest.raises(ZboptError) as error:
        parse(value, "key")
    assert str(error.value) == message
