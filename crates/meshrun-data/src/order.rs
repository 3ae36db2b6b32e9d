//! The global sample order: a seeded permutation of record indices per
//! epoch, computed in O(1) memory by a Feistel network with cycle walking.
//!
//! A balanced Feistel network over `2^(2h)` values is a bijection for any
//! round function; walking the cycle (re-applying until the value falls
//! below `n`) restricts it to a bijection of `0..n`. The domain is at most
//! `4n`, so a walk takes fewer than 4 steps on average.

/// A permutation of `0..n` determined by `(seed, epoch)`.
#[derive(Debug, Clone, Copy)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

const ROUNDS: usize = 6;

/// A strong 64-bit mixer (splitmix64's finalizer).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Permutation {
    pub fn new(n: u64, seed: u64, epoch: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut keys = [0u64; ROUNDS];
        let base = mix(seed ^ mix(epoch.wrapping_add(0x9e37_79b9_7f4a_7c15)));
        for (r, key) in keys.iter_mut().enumerate() {
            *key = mix(base.wrapping_add(r as u64));
        }
        Self { n, half_bits, keys }
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in self.keys {
            let next = left ^ (mix(right ^ key) & mask);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }

    /// The record at position `i` of this epoch (`i < n`).
    pub fn get(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = self.feistel(i);
        while x >= self.n {
            x = self.feistel(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn is_bijection(n: u64, seed: u64, epoch: u64) -> bool {
        let p = Permutation::new(n, seed, epoch);
        let mut hit = vec![false; n as usize];
        for i in 0..n {
            let j = p.get(i) as usize;
            if j >= n as usize || hit[j] {
                return false;
            }
            hit[j] = true;
        }
        true
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn bijection_for_many_sizes_and_seeds(n in 1u64..5000, seed in any::<u64>(), epoch in 0u64..100) {
            prop_assert!(is_bijection(n, seed, epoch));
        }
    }

    #[test]
    fn edge_sizes() {
        for n in [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 1 << 12, (1 << 12) + 1] {
            assert!(is_bijection(n, 42, 0), "n={n}");
        }
    }

    #[test]
    fn epochs_and_seeds_differ_and_shuffle() {
        let n = 1000;
        let a: Vec<u64> = (0..n).map(|i| Permutation::new(n, 1, 0).get(i)).collect();
        let b: Vec<u64> = (0..n).map(|i| Permutation::new(n, 1, 1).get(i)).collect();
        let c: Vec<u64> = (0..n).map(|i| Permutation::new(n, 2, 0).get(i)).collect();
        assert_ne!(a, b);
        assert_ne!(a, c);
        let fixed = a
            .iter()
            .enumerate()
            .filter(|(i, v)| *i as u64 == **v)
            .count();
        assert!(fixed < 20, "{fixed} fixed points: not shuffled");
    }
}
