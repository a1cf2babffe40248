//! Table snapshots of quantity parsing and rendering (`UPDATE_EXPECT=1` rewrites): each line is
//! an input, its exact amount in thousandths and its canonical form, or the error.

use expect_test::{Expect, expect};
use tether_resources::Amount;

fn check(inputs: &[&str], expect: Expect) {
    let table: String = inputs
        .iter()
        .map(|input| match Amount::parse(input) {
            Ok(amount) => format!("{input:?} = {} -> {}\n", amount.0, amount.render()),
            Err(error) => format!("{input:?} error: {error}\n"),
        })
        .collect();
    expect.assert_eq(&table);
}

#[test]
fn plain_and_decimal_suffixes() {
    check(
        &[
            "0", "1", "2", "110", "+3", "-2", "500m", "1500m", "1.5", ".5", "1.", "0.1", "100k",
            "1M", "3G", "1T", "1P", "1E", "250u", "1000000n", "007", "1.2500",
        ],
        expect![[r#"
            "0" = 0 -> 0
            "1" = 1000 -> 1
            "2" = 2000 -> 2
            "110" = 110000 -> 110
            "+3" = 3000 -> 3
            "-2" = -2000 -> -2
            "500m" = 500 -> 500m
            "1500m" = 1500 -> 1500m
            "1.5" = 1500 -> 1500m
            ".5" = 500 -> 500m
            "1." = 1000 -> 1
            "0.1" = 100 -> 100m
            "100k" = 100000000 -> 100k
            "1M" = 1000000000 -> 1M
            "3G" = 3000000000000 -> 3G
            "1T" = 1000000000000000 -> 1T
            "1P" = 1000000000000000000 -> 1P
            "1E" = 1000000000000000000000 -> 1E
            "250u" = 1 -> 1m
            "1000000n" = 1 -> 1m
            "007" = 7000 -> 7
            "1.2500" = 1250 -> 1250m
        "#]],
    );
}

#[test]
fn binary_suffixes_render_as_the_largest_whole_unit() {
    check(
        &[
            "1Ki",
            "1024",
            "2048",
            "1023",
            "1Mi",
            "1024Ki",
            "4Gi",
            "4096Mi",
            "1.5Gi",
            "0.5Ki",
            "1Ti",
            "1Pi",
            "1Ei",
            "3Ei",
            "1024Ei",
            "-4Gi",
            "0.001Ki",
            "1e3",
            "128974848",
        ],
        expect![[r#"
            "1Ki" = 1024000 -> 1Ki
            "1024" = 1024000 -> 1Ki
            "2048" = 2048000 -> 2Ki
            "1023" = 1023000 -> 1023
            "1Mi" = 1048576000 -> 1Mi
            "1024Ki" = 1048576000 -> 1Mi
            "4Gi" = 4294967296000 -> 4Gi
            "4096Mi" = 4294967296000 -> 4Gi
            "1.5Gi" = 1610612736000 -> 1536Mi
            "0.5Ki" = 512000 -> 512
            "1Ti" = 1099511627776000 -> 1Ti
            "1Pi" = 1125899906842624000 -> 1Pi
            "1Ei" = 1152921504606846976000 -> 1Ei
            "3Ei" = 3458764513820540928000 -> 3Ei
            "1024Ei" = 1180591620717411303424000 -> 1024Ei
            "-4Gi" = -4294967296000 -> -4Gi
            "0.001Ki" = 1024 -> 1024m
            "1e3" = 1000000 -> 1k
            "128974848" = 128974848000 -> 123Mi
        "#]],
    );
}

#[test]
fn exponents_and_rounding_up_below_a_thousandth() {
    check(
        &[
            "1e3",
            "1E3",
            "1e+3",
            "1e-3",
            "5e-4",
            "1.5e2",
            "1E-2",
            "12E",
            "1n",
            "1u",
            "999n",
            "1001n",
            "-1n",
            "0.0001",
            "1.0001",
            "0.0000001Ki",
            "0.00002Ki",
            "1e-100",
            "1e-99999999999999999999",
            "0e99999999999999999999",
            "0.5m",
            "-0",
        ],
        expect![[r#"
            "1e3" = 1000000 -> 1k
            "1E3" = 1000000 -> 1k
            "1e+3" = 1000000 -> 1k
            "1e-3" = 1 -> 1m
            "5e-4" = 1 -> 1m
            "1.5e2" = 150000 -> 150
            "1E-2" = 10 -> 10m
            "12E" = 12000000000000000000000 -> 12E
            "1n" = 1 -> 1m
            "1u" = 1 -> 1m
            "999n" = 1 -> 1m
            "1001n" = 1 -> 1m
            "-1n" = -1 -> -1m
            "0.0001" = 1 -> 1m
            "1.0001" = 1001 -> 1001m
            "0.0000001Ki" = 1 -> 1m
            "0.00002Ki" = 21 -> 21m
            "1e-100" = 1 -> 1m
            "1e-99999999999999999999" = 1 -> 1m
            "0e99999999999999999999" = 0 -> 0
            "0.5m" = 1 -> 1m
            "-0" = 0 -> 0
        "#]],
    );
}

#[test]
fn malformed_and_out_of_range_inputs_say_what_is_wrong() {
    check(
        &[
            "",
            "12x",
            "1 Gi",
            " 1",
            "Gi",
            "-",
            "+-1",
            ".",
            "1.2.3",
            "1ki",
            "1KI",
            "1e",
            "1e+",
            "1e3.5",
            "1m5",
            "0x10",
            "1Gi ",
            "1e40",
            "200000000000000000Ei",
            "1e35",
            "1e32",
        ],
        expect![[r#"
            "" error: "" is not a quantity: it is empty; use a number with a suffix such as 500m, 2, 4Gi
            "12x" error: "12x" is not a quantity: unknown suffix "x"; use a number with a suffix such as 500m, 2, 4Gi
            "1 Gi" error: "1 Gi" is not a quantity: it contains whitespace; use a number with a suffix such as 500m, 2, 4Gi
            " 1" error: " 1" is not a quantity: it contains whitespace; use a number with a suffix such as 500m, 2, 4Gi
            "Gi" error: "Gi" is not a quantity: it does not start with a number; use a number with a suffix such as 500m, 2, 4Gi
            "-" error: "-" is not a quantity: it does not start with a number; use a number with a suffix such as 500m, 2, 4Gi
            "+-1" error: "+-1" is not a quantity: it does not start with a number; use a number with a suffix such as 500m, 2, 4Gi
            "." error: "." is not a quantity: it does not start with a number; use a number with a suffix such as 500m, 2, 4Gi
            "1.2.3" error: "1.2.3" is not a quantity: it has more than one decimal point; use a number with a suffix such as 500m, 2, 4Gi
            "1ki" error: "1ki" is not a quantity: unknown suffix "ki"; use a number with a suffix such as 500m, 2, 4Gi
            "1KI" error: "1KI" is not a quantity: unknown suffix "KI"; use a number with a suffix such as 500m, 2, 4Gi
            "1e" error: "1e" is not a quantity: unknown suffix "e"; use a number with a suffix such as 500m, 2, 4Gi
            "1e+" error: "1e+" is not a quantity: unknown suffix "e+"; use a number with a suffix such as 500m, 2, 4Gi
            "1e3.5" error: "1e3.5" is not a quantity: unknown suffix "e3.5"; use a number with a suffix such as 500m, 2, 4Gi
            "1m5" error: "1m5" is not a quantity: unknown suffix "m5"; use a number with a suffix such as 500m, 2, 4Gi
            "0x10" error: "0x10" is not a quantity: unknown suffix "x10"; use a number with a suffix such as 500m, 2, 4Gi
            "1Gi " error: "1Gi " is not a quantity: it contains whitespace; use a number with a suffix such as 500m, 2, 4Gi
            "1e40" error: "1e40" is out of range: quantities must stay below 1.7e35 base units
            "200000000000000000Ei" error: "200000000000000000Ei" is out of range: quantities must stay below 1.7e35 base units
            "1e35" = 100000000000000000000000000000000000000 -> 100000000000000000E
            "1e32" = 100000000000000000000000000000000000 -> 100000000000000E
        "#]],
    );
}
