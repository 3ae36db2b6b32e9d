//! N-dimensional boxes (a shard's place in its global array) and the copy
//! of one box's overlap with another, in row-major order.
//!
//! A box is `[(start, stop); ndim]`. Copying the overlap of a stored shard
//! into a target shard moves contiguous runs along the last dimension, so a
//! resharded restore reads only the bytes that the target needs.

/// `[(start, stop)]` per dimension.
pub type Region = [(usize, usize)];

/// The intersection of two boxes, or `None` if they do not overlap.
pub fn intersect(a: &Region, b: &Region) -> Option<Vec<(usize, usize)>> {
    a.iter()
        .zip(b)
        .map(|(&(a0, a1), &(b0, b1))| {
            let (lo, hi) = (a0.max(b0), a1.min(b1));
            (lo < hi).then_some((lo, hi))
        })
        .collect()
}

fn extent(region: &Region) -> Vec<usize> {
    region.iter().map(|(a, b)| b - a).collect()
}

/// Number of elements in a box (1 for a scalar).
pub fn elements(region: &Region) -> usize {
    region.iter().map(|(a, b)| b - a).product()
}

/// Byte offset within a row-major box of the element at global `point`.
fn offset(region: &Region, point: &[usize], itemsize: usize) -> usize {
    let dims = extent(region);
    let mut off = 0;
    for ((d, &(start, _)), &p) in dims.iter().zip(region).zip(point) {
        off = off * d + (p - start);
    }
    off * itemsize
}

/// Calls `copy(src_offset, dst_offset, len)` for every contiguous run of
/// `overlap`, with offsets into the row-major buffers of `src` and `dst`.
pub fn runs(
    src: &Region,
    dst: &Region,
    overlap: &Region,
    itemsize: usize,
    mut copy: impl FnMut(usize, usize, usize),
) {
    if overlap.is_empty() {
        copy(0, 0, itemsize);
        return;
    }
    let last = overlap.len() - 1;
    let run = (overlap[last].1 - overlap[last].0) * itemsize;
    // Odometer over every dimension but the last.
    let mut point: Vec<usize> = overlap.iter().map(|(a, _)| *a).collect();
    loop {
        copy(
            offset(src, &point, itemsize),
            offset(dst, &point, itemsize),
            run,
        );
        let mut d = last;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            point[d] += 1;
            if point[d] < overlap[d].1 {
                break;
            }
            point[d] = overlap[d].0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fill(region: &Region, shape: &[usize]) -> Vec<u32> {
        // value = row-major global index
        let mut out = Vec::new();
        let mut point: Vec<usize> = region.iter().map(|(a, _)| *a).collect();
        if region.is_empty() {
            return vec![0];
        }
        loop {
            let mut g = 0;
            for (p, s) in point.iter().zip(shape) {
                g = g * s + p;
            }
            out.push(g as u32);
            let mut d = region.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                point[d] += 1;
                if point[d] < region[d].1 {
                    break;
                }
                point[d] = region[d].0;
            }
        }
    }

    proptest! {
        #[test]
        fn overlap_copy_matches_global_values(
            shape in proptest::collection::vec(1usize..6, 1..4),
            cuts in proptest::collection::vec((0usize..6, 0usize..6, 0usize..6, 0usize..6), 4),
        ) {
            let pick = |x: usize, y: usize, s: usize| { let a = x % s; (a, a + 1 + y % (s - a)) };
            let src: Vec<(usize, usize)> = shape.iter().zip(&cuts).map(|(&s, c)| pick(c.0, c.1, s)).collect();
            let dst: Vec<(usize, usize)> = shape.iter().zip(&cuts).map(|(&s, c)| pick(c.2, c.3, s)).collect();
            {
                let src_vals = fill(&src, &shape);
                let mut dst_vals = vec![u32::MAX; elements(&dst)];
                if let Some(ov) = intersect(&src, &dst) {
                    let s: Vec<u8> = src_vals.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let mut d: Vec<u8> = dst_vals.iter().flat_map(|v| v.to_le_bytes()).collect();
                    runs(&src, &dst, &ov, 4, |so, doff, n| d[doff..doff + n].copy_from_slice(&s[so..so + n]));
                    dst_vals = d.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                    let expect = fill(&dst, &shape);
                    let inside = fill(&ov, &shape);
                    for (v, e) in dst_vals.iter().zip(&expect) {
                        if inside.contains(e) { prop_assert_eq!(v, e); } else { prop_assert_eq!(*v, u32::MAX); }
                    }
                }
            }
        }
    }
}
