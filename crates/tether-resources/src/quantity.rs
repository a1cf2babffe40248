//! Kubernetes quantities as exact integers: parsing the API's grammar and rendering a canonical
//! short form.

use std::fmt;
use std::str::FromStr;

use crate::QuantityError;

/// An amount in thousandths of the resource's base unit, for every resource alike: cpu in
/// millicores, memory in thousandths of a byte. One integer arithmetic then serves all
/// resources, and nothing a Kubernetes object can express (down to `1m`) is lost.
///
/// `"1"` is `Amount(1000)`, `"500m"` is `Amount(500)`, `"1Ki"` is `Amount(1_024_000)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Amount(pub i128);

/// Exponents beyond this make any non-zero mantissa overflow (positive) or round to one
/// thousandth (negative), so clamping to it changes no result and keeps the arithmetic small.
const EXPONENT_CLAMP: i64 = 1_000_000;

/// Binary suffixes by power of 1024, largest first, as [`Amount::render`] tries them.
const BINARY: [(u32, &str); 6] = [
    (6, "Ei"),
    (5, "Pi"),
    (4, "Ti"),
    (3, "Gi"),
    (2, "Mi"),
    (1, "Ki"),
];

impl Amount {
    /// Nothing.
    pub const ZERO: Amount = Amount(0);

    /// Reads a Kubernetes quantity: an optional sign, a decimal number (`2`, `1.5`, `.5`), then
    /// a binary suffix (`Ki` .. `Ei`), a decimal one (`n u m k M G T P E` or none) or a decimal
    /// exponent (`e3`, `E-2`).
    ///
    /// The result is exact; anything finer than a thousandth rounds away from zero, as
    /// Kubernetes does for milli-values (`"1n"` of cpu is `1m`).
    pub fn parse(s: &str) -> Result<Amount, QuantityError> {
        let malformed = |problem: String| QuantityError::Malformed {
            input: s.to_owned(),
            problem,
        };
        if s.is_empty() {
            return Err(malformed("it is empty".to_owned()));
        }
        if s.chars().any(char::is_whitespace) {
            return Err(malformed("it contains whitespace".to_owned()));
        }
        let (negative, unsigned) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_len = unsigned
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (number, suffix) = unsigned.split_at(number_len);
        if !number.bytes().any(|b| b.is_ascii_digit()) {
            return Err(malformed("it does not start with a number".to_owned()));
        }
        let Some((pow10, pow2)) = suffix_scale(suffix) else {
            return Err(malformed(format!("unknown suffix {suffix:?}")));
        };
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if frac_part.contains('.') {
            return Err(malformed("it has more than one decimal point".to_owned()));
        }

        let mut digits: Vec<u8> = int_part
            .bytes()
            .chain(frac_part.bytes())
            .map(|b| b - b'0')
            .collect();
        // Counting in thousandths is a shift of three decimal places.
        let mut exp = pow10 + 3 - i64::try_from(frac_part.len()).unwrap_or(EXPONENT_CLAMP);
        let Some(first) = digits.iter().position(|&d| d != 0) else {
            return Ok(Amount::ZERO);
        };
        digits.drain(..first);
        while digits.last() == Some(&0) {
            digits.pop();
            exp += 1;
        }
        // Negating after the fact keeps rounding away from zero, as Kubernetes does; the
        // unsigned subtraction also admits i128::MIN, which render can produce.
        scale(&digits, exp, pow2)
            .and_then(|m| {
                if negative {
                    0i128.checked_sub_unsigned(m)
                } else {
                    i128::try_from(m).ok()
                }
            })
            .map(Amount)
            .ok_or_else(|| QuantityError::OutOfRange {
                input: s.to_owned(),
            })
    }

    /// The canonical short form: the shortest of a whole number of `Ki`..`Ei` (`4Gi`), of
    /// `k`..`E` (`10G`), of whole base units (`2`, `110`) and of thousandths (`1500m`); on a
    /// tie the binary form, then the plain number. [`Amount::parse`] reads it back exactly.
    pub fn render(self) -> String {
        let v = self.0;
        let mut candidates = Vec::new();
        if v.unsigned_abs() >= 1024 * 1000
            && let Some((unit, suffix)) = BINARY
                .iter()
                .map(|(power, suffix)| (1000 * 1024i128.pow(*power), *suffix))
                .find(|(unit, _)| v % unit == 0)
        {
            candidates.push(format!("{}{suffix}", v / unit));
        }
        if v % 1000 == 0 {
            candidates.push((v / 1000).to_string());
            if let Some((unit, suffix)) = DECIMAL
                .iter()
                .map(|(power, suffix)| (1000 * 1000i128.pow(*power), *suffix))
                .find(|(unit, _)| v % unit == 0 && v != 0)
            {
                candidates.push(format!("{}{suffix}", v / unit));
            }
        } else {
            candidates.push(format!("{v}m"));
        }
        // The first of the shortest: binary before plain before decimal.
        candidates
            .into_iter()
            .min_by_key(String::len)
            .unwrap_or_else(|| "0".to_owned())
    }
}

/// Decimal suffixes from the largest down, as (power of 1000, suffix).
const DECIMAL: [(u32, &str); 6] = [(6, "E"), (5, "P"), (4, "T"), (3, "G"), (2, "M"), (1, "k")];

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

impl FromStr for Amount {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Amount::parse(s)
    }
}

/// The suffix as (power of ten, power of two), or `None` when it is not one.
fn suffix_scale(suffix: &str) -> Option<(i64, u32)> {
    let scale = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let unsigned = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Only digits remain, so a failed parse is an overflow.
            let pow10 = exponent
                .parse::<i64>()
                .unwrap_or(if exponent.starts_with('-') {
                    -EXPONENT_CLAMP
                } else {
                    EXPONENT_CLAMP
                });
            (pow10.clamp(-EXPONENT_CLAMP, EXPONENT_CLAMP), 0)
        }
    };
    Some(scale)
}

/// `digits × 10^exp × 2^pow2` rounded up, or `None` on overflow. `digits` are decimal digits,
/// most significant first, with neither leading nor trailing zeros.
fn scale(digits: &[u8], exp: i64, pow2: u32) -> Option<u128> {
    let binary = 1u128 << pow2;
    let value_of = |ds: &[u8]| {
        ds.iter().try_fold(0u128, |acc, &d| {
            acc.checked_mul(10)?.checked_add(u128::from(d))
        })
    };
    if exp >= 0 {
        let tens = 10u128.checked_pow(u32::try_from(exp).ok()?)?;
        return value_of(digits)?.checked_mul(tens)?.checked_mul(binary);
    }
    // Split at the decimal point: the whole part scales exactly, the fraction `f` in (0, 1)
    // contributes floor(f × 2^pow2) more whole thousandths, plus one if anything is left over.
    let frac_len = usize::try_from(exp.unsigned_abs()).ok()?;
    let whole_len = digits.len().saturating_sub(frac_len);
    let (whole, frac) = digits.split_at(whole_len);
    let whole = value_of(whole)?.checked_mul(binary)?;
    let leading_zeros = frac_len - frac.len();
    // 2^60 < 10^19: past that many leading zeros, f × 2^pow2 < 1.
    if leading_zeros > 19 {
        return whole.checked_add(1);
    }
    let mut frac: Vec<u8> = std::iter::repeat_n(0, leading_zeros)
        .chain(frac.iter().copied())
        .collect();
    let mut carried = 0u128;
    for _ in 0..pow2 {
        let mut carry = 0;
        for d in frac.iter_mut().rev() {
            let doubled = *d * 2 + carry;
            *d = doubled % 10;
            carry = doubled / 10;
        }
        carried = carried * 2 + u128::from(carry);
    }
    let rest = u128::from(frac.iter().any(|&d| d != 0));
    whole.checked_add(carried)?.checked_add(rest)
}
