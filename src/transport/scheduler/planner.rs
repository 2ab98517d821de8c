//! Splits a request into slices with Mooncake's rule: slices of
//! `MC_SLICE_SIZE`, except that a tail no longer than the fragment limit
//! joins the slice before it.

/// The slices of a `length`-byte request as `(offset, len)` pairs.
pub fn slices(
    length: u64,
    slice_size: u64,
    fragment_limit: u64,
) -> impl Iterator<Item = (u64, u64)> {
    let slice_size = slice_size.max(1);
    let mut offset = 0;
    std::iter::from_fn(move || {
        if offset >= length {
            return None;
        }
        let remaining = length - offset;
        let len = if remaining <= slice_size.saturating_add(fragment_limit) {
            remaining
        } else {
            slice_size
        };
        let slice = (offset, len);
        offset += len;
        Some(slice)
    })
}

/// How many slices [`slices`] yields.
pub fn slice_count(length: u64, slice_size: u64, fragment_limit: u64) -> u64 {
    let slice_size = slice_size.max(1);
    if length == 0 {
        return 0;
    }
    if length <= slice_size.saturating_add(fragment_limit) {
        return 1;
    }
    // All full slices but the last; the last absorbs a short tail.
    let full = length / slice_size;
    let tail = length % slice_size;
    if tail == 0 || tail <= fragment_limit {
        full
    } else {
        full + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_rule() {
        let v: Vec<_> = slices(100, 40, 10).collect();
        assert_eq!(v, vec![(0, 40), (40, 40), (80, 20)]);
        let v: Vec<_> = slices(100, 40, 30).collect();
        assert_eq!(v, vec![(0, 40), (40, 60)]);
        let v: Vec<_> = slices(130, 40, 10).collect();
        assert_eq!(v, vec![(0, 40), (40, 40), (80, 50)]);
        let v: Vec<_> = slices(50, 64, 16).collect();
        assert_eq!(v, vec![(0, 50)]);
        assert_eq!(slices(0, 64, 16).count(), 0);
    }

    #[test]
    fn count_matches_iteration() {
        for len in [0, 1, 63, 64, 65, 79, 80, 81, 127, 128, 129, 1000, 1 << 20] {
            for (s, f) in [(64, 16), (64, 0), (1, 0), (1000, 250)] {
                assert_eq!(
                    slice_count(len, s, f),
                    slices(len, s, f).count() as u64,
                    "{len} {s} {f}"
                );
                let total: u64 = slices(len, s, f).map(|(_, l)| l).sum();
                assert_eq!(total, len);
            }
        }
    }
}
