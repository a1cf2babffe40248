//! Pure text helpers: kubectl-style tables, human ages, and the duration syntax of `--ttl`,
//! `--timeout` and `--identity-lifetime`.

use std::time::Duration;

/// A table in kubectl's style: upper-case headers, columns padded to their widest cell and
/// separated by three spaces, no borders.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths.get(i).copied().unwrap_or(0);
                line.push_str(cell);
                line.push_str(&" ".repeat(pad - cell.chars().count() + 3));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A duration the way kubectl prints ages: `45s`, `3m20s`, `95m`, `5h30m`, `20h`, `3d4h`,
/// `40d`, `2y30d`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    let (m, h, days) = (s / 60, s / 3600, s / 86_400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        match s % 60 {
            0 => format!("{m}m"),
            rest => format!("{m}m{rest}s"),
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            rest => format!("{h}h{rest}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 192 {
        match h % 24 {
            0 => format!("{days}d"),
            rest => format!("{days}d{rest}h"),
        }
    } else if days < 365 * 2 {
        format!("{days}d")
    } else {
        format!("{}y{}d", days / 365, days % 365)
    }
}

/// Why a duration could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: {problem}; write numbers with units d, h, m or s, for example \
     `24h`, `90m` or `1h30m`"
)]
pub struct InvalidDuration {
    /// The rejected text.
    pub input: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Parses `1h30m`, `24h`, `7d`, `90s`: whole numbers each followed by `d`, `h`, `m` or `s`.
pub fn parse_duration(input: &str) -> Result<Duration, InvalidDuration> {
    let err = |problem| InvalidDuration {
        input: input.to_owned(),
        problem,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("it is empty"));
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit: u64 = match c {
            'd' => 86_400,
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(err("it has a character other than digits and d, h, m, s")),
        };
        if number.is_empty() {
            return Err(err("a unit has no number before it"));
        }
        let n: u64 = number.parse().map_err(|_| err("a number is too large"))?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| err("it is too long"))?;
        number.clear();
    }
    if !number.is_empty() {
        return Err(err("the last number has no unit"));
    }
    Ok(Duration::from_secs(total))
}

/// The canonical form of a duration, in hours, minutes and seconds (`1h30m`, `24h`, `45s`):
/// the form the controller's flags accept.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if sec > 0 || out.is_empty() {
        out.push_str(&format!("{sec}s"));
    }
    out
}

/// A duration as one number and the largest unit that divides it (`90m`, `24h`, `45s`): the
/// form `tetherd`'s flags accept.
pub fn format_duration_one_unit(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s > 0 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn tables_align_columns_and_trim_line_ends() {
        let t = table(
            &["ID", "EXPIRES", "DESCRIPTION"],
            &[
                vec!["abc123".into(), "2030-01-01T00:00:00Z".into(), "".into()],
                vec!["x".into(), "soon".into(), "for west".into()],
            ],
        );
        expect![[r#"
            ID       EXPIRES                DESCRIPTION
            abc123   2030-01-01T00:00:00Z
            x        soon                   for west
        "#]]
        .assert_eq(&t);
    }

    #[test]
    fn ages_follow_kubectl() {
        let cases = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600 + 30 * 60, "3h30m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (3 * 86_400 + 4 * 3600, "3d4h"),
            (40 * 86_400, "40d"),
            (800 * 86_400, "2y70d"),
        ];
        let got: Vec<(u64, String)> = cases
            .iter()
            .map(|(s, _)| (*s, age(Duration::from_secs(*s))))
            .collect();
        let want: Vec<(u64, String)> = cases.iter().map(|(s, a)| (*s, (*a).into())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn durations_parse_and_name_the_problem() {
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration(" 90s "), Ok(Duration::from_secs(90)));
        for (bad, problem) in [
            ("", "it is empty"),
            ("10", "the last number has no unit"),
            ("h", "a unit has no number before it"),
            (
                "1.5h",
                "it has a character other than digits and d, h, m, s",
            ),
            ("-1h", "it has a character other than digits and d, h, m, s"),
            ("99999999999999999999d", "a number is too large"),
        ] {
            assert_eq!(
                parse_duration(bad).map_err(|e| e.problem),
                Err(problem),
                "{bad}"
            );
        }
        let msg = parse_duration("1x").expect_err("invalid").to_string();
        assert!(msg.contains("\"1x\"") && msg.contains("1h30m"), "{msg}");
    }

    proptest! {
        #[test]
        fn formatting_round_trips(secs in 0u64..10_000_000) {
            let d = Duration::from_secs(secs);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
            let one = format_duration_one_unit(d);
            prop_assert_eq!(parse_duration(&one), Ok(d));
            prop_assert_eq!(one.chars().filter(char::is_ascii_alphabetic).count(), 1);
        }
    }
}
