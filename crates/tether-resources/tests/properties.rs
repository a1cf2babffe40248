//! Property tests: rendering round-trips through parsing, milli-suffixes are exact, sums do not
//! depend on order, subtraction undoes addition, and `decide` never grants more than is free.

use proptest::prelude::*;
use tether_resources::{Amount, Decision, Resources, decide};

const NAMES: [&str; 4] = ["cpu", "memory", "pods", "nvidia.com/gpu"];

/// Amounts across the whole range, biased towards the shapes `render` treats specially
/// (multiples of 1024^k, whole units, thousandths).
fn amount() -> impl Strategy<Value = Amount> {
    prop_oneof![
        any::<i128>().prop_map(|v| Amount(v / 1000)),
        (any::<i32>(), 0u32..=6).prop_map(|(n, k)| Amount(i128::from(n) * 1000 * 1024i128.pow(k))),
        any::<i64>().prop_map(|n| Amount(i128::from(n) * 1000)),
        (-5000i128..5000).prop_map(Amount),
        prop_oneof![Just(Amount(i128::MIN)), Just(Amount(i128::MAX))],
    ]
}

/// Resources over a few names, amounts between -1 and 8 units in thousandths.
fn resources() -> impl Strategy<Value = Resources> {
    proptest::collection::btree_map(
        proptest::sample::select(NAMES.to_vec()).prop_map(str::to_owned),
        (-1000i128..8000).prop_map(Amount),
        0..=NAMES.len(),
    )
    .prop_map(Resources)
}

proptest! {
    #[test]
    fn render_then_parse_is_the_identity(a in amount()) {
        prop_assert_eq!(Amount::parse(&a.render()), Ok(a));
    }

    #[test]
    fn milli_suffix_is_exact(n in any::<i128>().prop_map(|v| v / 2)) {
        prop_assert_eq!(Amount::parse(&format!("{n}m")), Ok(Amount(n)));
    }

    #[test]
    fn sign_is_symmetric(digits in "[0-9]{1,12}(\\.[0-9]{1,12})?", suffix in "(|n|u|m|k|M|G|Ki|Mi|Gi|e-7|e4)") {
        let positive = Amount::parse(&format!("{digits}{suffix}")).expect("grammar-conforming");
        prop_assert_eq!(Amount::parse(&format!("-{digits}{suffix}")), Ok(Amount(-positive.0)));
    }

    #[test]
    fn sum_is_order_independent(mut items in proptest::collection::vec(resources(), 0..6), seed in any::<u64>()) {
        let forward = Resources::sum(&items);
        // A deterministic shuffle from the seed.
        let len = items.len().max(1);
        items.rotate_left(usize::try_from(seed).unwrap_or(0) % len);
        items.reverse();
        prop_assert_eq!(&Resources::sum(&items), &forward);
        for name in NAMES {
            let expected: i128 = items.iter().map(|r| r.get(name).0).sum();
            prop_assert_eq!(forward.get(name).0, expected);
        }
    }

    #[test]
    fn subtracting_what_was_added_restores_every_amount(
        base in resources(),
        items in proptest::collection::vec(resources(), 0..6),
        seed in any::<u64>(),
    ) {
        let mut total = base.clone();
        for item in &items {
            total.add(item);
        }
        // Taken away in another order than they came.
        let mut out = items.clone();
        let len = out.len().max(1);
        out.rotate_left(usize::try_from(seed).unwrap_or(0) % len);
        for item in &out {
            total.subtract(item);
        }
        for name in NAMES {
            prop_assert_eq!(total.get(name), base.get(name));
        }
    }

    #[test]
    fn decide_never_grants_more_than_is_free(
        request in resources(),
        capacity in resources(),
        others in resources(),
    ) {
        match decide(&request, &capacity, &others) {
            Decision::Accept { grant } => {
                prop_assert!(!grant.is_empty());
                for (name, amount) in &grant.0 {
                    prop_assert!(amount.0 > 0);
                    prop_assert_eq!(*amount, request.get(name));
                    let free = (capacity.get(name).0 - others.get(name).0).max(0);
                    prop_assert!(amount.0 <= free, "{} granted {:?} with {} free", name, amount, free);
                }
                // All or nothing: every positive entry of the request is granted.
                for (name, amount) in &request.0 {
                    if amount.0 > 0 {
                        prop_assert_eq!(grant.get(name), *amount);
                    }
                }
            }
            Decision::Deny { message, .. } => prop_assert!(!message.is_empty()),
        }
    }
}
