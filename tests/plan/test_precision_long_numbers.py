"""--precision with a number too long for int(): python refuses strings of more than 4300 digits with a
ValueError (sys.int_max_str_digits), which reached the user as a traceback from parse_precision. Such a
threshold or seed is out of range anyway: refused in one line like any other. From a review helper; fails
on the old code."""
import pytest

from plan_helpers import run_dasc
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan.precision import parse_precision

LONG = "9" * 5000


@pytest.mark.parametrize("spec,match", [
    (f"horizon:{LONG}", "integers in"),
    (f"horizon:40,{LONG}", "integers in"),
    (f"horizon:-{LONG},40", "integers in"),
    (f"horizon@{LONG}", "seed after '@'"),
])
def test_overlong_numbers_refused_in_one_line(synthetic_kda, spec, match):
    with pytest.raises(UserError, match=match):
        parse_precision(spec, 8)
    code, out, err = run_dasc("plan", "--model", synthetic_kda, "--wmax", "8", "--precision", spec)
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-400:]
    assert match.split()[0] in err


def test_leading_zeros_still_parse():
    # a length check must not refuse a small value written with many zeros
    assert parse_precision("horizon:" + "0" * 30 + "40,400@" + "0" * 30 + "7", 8).spec() == \
        "horizon:40,400:int4,int8,native@7"


def test_leading_zeros_past_the_digit_limit_still_parse():
    # python's limit counts leading zeros too: a small value behind 5000 zeros is still that value
    assert parse_precision("horizon:" + "0" * 5000 + "40,400@" + "0" * 5000 + "7", 8).spec() == \
        "horizon:40,400:int4,int8,native@7"
