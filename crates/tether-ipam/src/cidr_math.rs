//! Block arithmetic on IPv4 prefixes: overlap tests and the lowest-free-aligned-block search.
//! Works in `u64` so that the end of 255.255.255.255/32 does not overflow.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Whether two networks share an address (aligned prefixes either nest or are disjoint).
pub(crate) fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn start(net: Ipv4Net) -> u64 {
    u64::from(u32::from(net.network()))
}

fn end_exclusive(net: Ipv4Net) -> u64 {
    u64::from(u32::from(net.broadcast())) + 1
}

/// The lowest block of `prefix_len` inside `pool` that overlaps none of `occupied`.
pub(crate) fn lowest_free_block(
    pool: Ipv4Net,
    prefix_len: u8,
    occupied: &[Ipv4Net],
) -> Option<Ipv4Net> {
    if pool.prefix_len() > prefix_len {
        return None;
    }
    let size = 1u64 << (32 - u32::from(prefix_len));
    let pool_end = end_exclusive(pool);
    // The pool is aligned to a coarser prefix, so its start is aligned to `size`.
    let mut candidate = start(pool);
    while candidate + size <= pool_end {
        let addr = Ipv4Addr::from(u32::try_from(candidate).expect("invariant: candidate < 2^32"));
        let block = Ipv4Net::new(addr, prefix_len).expect("invariant: prefix_len <= 32");
        match occupied
            .iter()
            .filter(|taken| overlaps(**taken, block))
            .map(|t| end_exclusive(*t))
            .max()
        {
            None => return Some(block),
            // Skip past the blocker; a bigger blocker is itself aligned, a smaller one lies
            // inside this block, so rounding up to `size` lands on the next candidate.
            Some(blocker_end) => {
                candidate = (candidate + size).max(blocker_end).next_multiple_of(size);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> Ipv4Net {
        text.parse().unwrap()
    }

    #[test]
    fn finds_lowest_block_skipping_bigger_and_smaller_blockers() {
        let pool = net("10.0.0.0/22");
        let occupied = [net("10.0.0.128/25"), net("10.0.1.0/24"), net("10.0.0.0/8")];
        assert_eq!(
            lowest_free_block(pool, 24, &occupied[..2]),
            Some(net("10.0.2.0/24"))
        );
        assert_eq!(
            lowest_free_block(pool, 25, &occupied[..2]),
            Some(net("10.0.0.0/25"))
        );
        assert_eq!(lowest_free_block(pool, 24, &occupied), None);
        assert_eq!(
            lowest_free_block(pool, 21, &[]),
            None,
            "block larger than pool"
        );
    }

    #[test]
    fn top_of_the_address_space_does_not_overflow() {
        let pool = net("255.255.255.0/24");
        assert_eq!(
            lowest_free_block(pool, 32, &[net("255.255.255.0/25")]),
            Some(net("255.255.255.128/32"))
        );
        assert_eq!(
            lowest_free_block(pool, 24, &[net("255.255.255.255/32")]),
            None
        );
    }
}
