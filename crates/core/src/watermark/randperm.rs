//! torch's CPU `randperm`, draw for draw: a `torch.Generator` on the CPU is a 32-bit Mersenne
//! Twister (`at::mt19937`) seeded by `manual_seed(seed)` with the seed's low 32 bits
//! (`init_genrand`, as C++'s `std::mt19937`), and `torch.randperm(n, generator=g)` for
//! `n < 2^32 / 20` (every vocab) is the Fisher-Yates shuffle below: the identity, then for
//! `i in 0..n-1` a swap of `i` with `i + random() % (n - i)`, `random()` the generator's next
//! 32-bit draw. Position `i` is final after step `i`, so the first `g` entries need `g` draws.
//! Both were read from torch 2.15 by experiment and are checked against values it printed.

use rand_mt::Mt;

/// The largest `n` this shuffle reproduces: beyond it torch draws 64-bit numbers instead.
pub const MAX_N: usize = (u32::MAX / 20) as usize - 1;

/// The generator `manual_seed(seed)` leaves: only the low 32 bits of the seed count.
pub fn generator(seed: u64) -> Mt {
    Mt::new(seed as u32)
}

/// `torch.randperm(n, generator)` with the generator seeded by `seed`, whole.
pub fn randperm(n: usize, seed: u64) -> Vec<u32> {
    let mut perm = Vec::new();
    randperm_prefix(n, n, seed, &mut perm);
    perm
}

/// The first `len` entries of `torch.randperm(n)` seeded by `seed`, into `perm` (which holds the
/// whole shuffled array after the call, its first `len` entries final): `min(len, n - 1)` draws.
pub fn randperm_prefix(n: usize, len: usize, seed: u64, perm: &mut Vec<u32>) {
    assert!(n <= MAX_N, "randperm beyond {MAX_N} draws 64-bit numbers");
    perm.clear();
    perm.extend(0..n as u32);
    let mut rng = generator(seed);
    for i in 0..len.min(n.saturating_sub(1)) {
        // `n - i` fits in 32 bits, so the 32-bit remainder is torch's 64-bit one.
        let z = rng.next_u32() % (n - i) as u32;
        perm.swap(i, i + z as usize);
    }
}

/// Whether `token` is among the first `len` entries of `torch.randperm(n)` seeded by `seed`,
/// without the array: the token's position is followed through the swaps, and the draws stop
/// once it lands in the prefix (a swap into position `i` is final).
pub fn in_prefix(n: usize, len: usize, seed: u64, token: u32) -> bool {
    assert!(n <= MAX_N, "randperm beyond {MAX_N} draws 64-bit numbers");
    let token = token as usize;
    if token >= n {
        return false;
    }
    if len >= n {
        return true;
    }
    let mut rng = generator(seed);
    let mut at = token;
    for i in 0..len {
        let j = i + (rng.next_u32() % (n - i) as u32) as usize;
        if at == j {
            return true;
        }
        if at == i {
            at = j;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    // Printed by torch 2.15.0 (CPU): `g = torch.Generator(); g.manual_seed(s);
    // torch.randperm(10, generator=g).tolist()`.
    const TORCH_RANDPERM_10: [(u64, [u32; 10]); 5] = [
        (0, [4, 1, 7, 5, 3, 9, 0, 8, 6, 2]),
        (5489, [2, 7, 8, 4, 0, 6, 1, 9, 3, 5]),
        (15485863, [8, 5, 7, 0, 2, 6, 9, 1, 4, 3]),
        (4294967301, [1, 4, 9, 6, 3, 5, 0, 2, 8, 7]),
        (18446744073709551614, [0, 1, 3, 5, 7, 9, 8, 6, 4, 2]),
    ];

    #[test]
    fn randperm_equals_torchs() {
        for (seed, expected) in TORCH_RANDPERM_10 {
            assert_eq!(randperm(10, seed), expected, "seed {seed}");
        }
        // `g.manual_seed(-3)`: torch takes a negative seed's two's complement.
        assert_eq!(randperm(10, (-3i64) as u64), [1, 9, 7, 8, 5, 4, 3, 2, 6, 0]);
    }

    #[test]
    fn the_fixed_table_equals_torchs() {
        // torch 2.15.0: `g.manual_seed(15485863); t = torch.randperm(1_000_003, generator=g)`:
        // `t[:8]`, `t[[1, 1000, 999_999, 1_000_002]]`, `(torch.arange(1_000_003) * t).sum()`.
        let t = randperm(1_000_003, 15485863);
        assert_eq!(
            t[..8],
            [138280, 994103, 467886, 915329, 149437, 806681, 915993, 784932]
        );
        assert_eq!(
            [t[1], t[1000], t[999_999], t[1_000_002]],
            [994103, 497522, 64375, 865023]
        );
        let weighted: u64 = t
            .iter()
            .enumerate()
            .map(|(i, &v)| i as u64 * v as u64)
            .sum();
        assert_eq!(weighted, 249995490708061396);
    }

    #[test]
    fn a_vocab_green_list_equals_torchs() {
        // torch 2.15.0: `g.manual_seed(15485863 * 42 % (2**64 - 1)); p = torch.randperm(151936,
        // generator=g)`: `p[:8]`, `sorted(p[:37984])[:8]`, `sum(p[:37984])`.
        let mut perm = Vec::new();
        randperm_prefix(151_936, 37_984, 15485863 * 42, &mut perm);
        assert_eq!(
            perm[..8],
            [100612, 100754, 139950, 21968, 121621, 85450, 5454, 12260]
        );
        let mut green = perm[..37_984].to_vec();
        green.sort_unstable();
        assert_eq!(green[..8], [5, 8, 9, 20, 22, 23, 24, 26]);
        assert_eq!(green.iter().map(|&t| t as u64).sum::<u64>(), 2884695296);
    }

    #[test]
    fn the_generator_is_cpp_mt19937() {
        // C++'s `std::mt19937` default-seeded (5489): its 10,000th draw is 4123659995 (the
        // standard's required value).
        let mut rng = generator(5489);
        let last = (0..10_000).map(|_| rng.next_u32()).last();
        assert_eq!(last, Some(4123659995));
        // Only the low 32 bits of the seed count.
        assert_eq!(randperm(50, 7), randperm(50, 7 + (1 << 32)));
    }

    #[test]
    fn a_prefix_is_the_whole_shuffles_and_membership_agrees() {
        for (n, len, seed) in [
            (1, 0, 3),
            (1, 1, 3),
            (2, 1, 9),
            (97, 24, 5),
            (1000, 999, 1),
            (1000, 1000, 2),
        ] {
            let whole = randperm(n, seed);
            let mut sorted = whole.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>());
            let mut perm = Vec::new();
            randperm_prefix(n, len, seed, &mut perm);
            assert_eq!(perm[..len], whole[..len]);
            for token in 0..n as u32 + 2 {
                assert_eq!(
                    in_prefix(n, len, seed, token),
                    whole[..len].contains(&token),
                    "n {n} len {len} token {token}"
                );
            }
        }
    }
}
