//! Uploading one rank's shard file: straight from the buffers it is made
//! of (the header, then each shard's bytes, as the caller holds them), as
//! one put when small, else as a multipart upload with up to
//! [`CONCURRENCY`](crate::remote::CONCURRENCY) parts in flight. Parts are
//! slices of those buffers, never copies.

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};

use crate::error::StoreError;
use crate::remote::{block, Client, CONCURRENCY};

/// Bytes in one part of a multipart upload (S3 wants 5 MiB at least, all
/// but the last). Larger parts mean fewer requests; this many in flight
/// keep a fast link busy.
pub const PART: usize = 16 << 20;

/// The smallest part S3 takes (all but the last part).
const MIN_PART: usize = 5 << 20;

/// Parts cut out of `pieces` without copying: `PART` bytes each where a
/// piece allows, cut at the pieces' own boundaries where it can, so that
/// a part is one contiguous buffer (sent as is) rather than several (sent
/// as a stream of them, which the server takes markedly slower): small
/// pieces are packed together, and a tail under `MIN_PART` stays with the
/// part before it (so a part holds at most `PART + MIN_PART` bytes).
fn cut(pieces: &[Bytes]) -> Vec<PutPayload> {
    let mut out = Vec::new();
    let mut current: Vec<Bytes> = Vec::new();
    let mut size = 0;
    for piece in pieces {
        let mut rest = piece.clone();
        while !rest.is_empty() {
            if size >= MIN_PART && size + rest.len() > PART {
                out.push(current.drain(..).collect());
                size = 0;
            }
            let room = PART.saturating_sub(size).max(1);
            let take = if rest.len() <= room || rest.len() - room < MIN_PART {
                rest.len()
            } else {
                room
            };
            current.push(rest.split_to(take));
            size += take;
            if size >= PART {
                out.push(current.drain(..).collect());
                size = 0;
            }
        }
    }
    if size > 0 || out.is_empty() {
        out.push(current.into_iter().collect());
    }
    out
}

/// Writes the object `key` made of `pieces`, in order.
pub fn upload_file(client: &Client, key: &Key, pieces: &[Bytes]) -> Result<(), StoreError> {
    let parts = cut(pieces);
    let store = client.store();
    let k = key.clone();
    let result = block(async move {
        if parts.len() == 1 {
            let part = parts.into_iter().next().expect("one part");
            return store.put(&k, part).await.map(drop);
        }
        let mut upload = store.put_multipart(&k).await?;
        let sends: Vec<_> = parts.into_iter().map(|p| upload.put_part(p)).collect();
        let sent = futures::stream::iter(sends)
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await;
        match sent {
            Ok(_) => upload.complete().await.map(drop),
            Err(e) => {
                // Not left for the next attempt's clean-up to find.
                let _ = upload.abort().await;
                Err(e)
            }
        }
    });
    result.map_err(|source| StoreError::Storage {
        what: "cannot upload",
        url: client.url(key),
        source: Box::new(source),
    })
}

/// Keeps an `Arc` alive inside `Bytes` without copying what it points to.
pub fn shared<T: AsRef<[u8]> + Send + Sync + 'static>(owner: Arc<T>) -> Bytes {
    struct Owner<T>(Arc<T>);
    impl<T: AsRef<[u8]>> AsRef<[u8]> for Owner<T> {
        fn as_ref(&self) -> &[u8] {
            self.0.as_ref().as_ref()
        }
    }
    Bytes::from_owner(Owner(owner))
}

/// The raw bandwidth of the storage with the client stack checkpoints use:
/// seconds to upload `size` bytes as one object (parts and concurrency as
/// for a shard file), then to download it in the ranges and concurrency of
/// a restore (`step` bytes a request), then the object is deleted. For
/// benchmarks.
pub fn roundtrip(
    dir: &crate::RemoteDir,
    size: usize,
    step: usize,
) -> Result<(f64, f64), StoreError> {
    // Bytes that do not compress, as a model's do not: a store that
    // compresses would otherwise make a constant buffer look fast.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let data: Bytes = (0..size.div_ceil(8))
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()
        })
        .take(size)
        .collect::<Vec<u8>>()
        .into();
    let key = dir.object(&format!(".meshrun-bandwidth-{}", std::process::id()));
    let t0 = std::time::Instant::now();
    upload_file(&dir.client, &key, &[data])?;
    let up = t0.elapsed().as_secs_f64();
    let ranges = (0..size)
        .step_by(step)
        .map(|lo| lo as u64..(lo + step).min(size) as u64)
        .collect();
    let t0 = std::time::Instant::now();
    let got = dir.client.get_ranges(&key, ranges)?;
    let down = t0.elapsed().as_secs_f64();
    dir.client.delete(vec![key])?;
    let n: usize = got.iter().map(Bytes::len).sum();
    if n != size {
        return Err(StoreError::Storage {
            what: "cannot read back",
            url: dir.url(),
            source: Box::new(object_store::Error::Generic {
                store: "meshrun",
                source: format!("read back {n} bytes of {size}").into(),
            }),
        });
    }
    Ok((up, down))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_slices_of_the_pieces_in_order_one_buffer_each_where_they_can_be() {
        let mib = 1 << 20;
        let a = Bytes::from(vec![1u8; 32 * mib]);
        let b = Bytes::from(vec![2u8; 20 * mib]);
        let small: Vec<Bytes> = (0..3).map(|i| Bytes::from(vec![i as u8; mib])).collect();
        let mut pieces = vec![Bytes::from_static(b"head"), a.clone(), b];
        pieces.extend(small);
        let parts = cut(&pieces);
        let sizes: Vec<usize> = parts.iter().map(PutPayload::content_length).collect();
        // header + a's first 16 MiB - 4; a's rest (16 MiB + 4, its tail
        // too small for a part of its own); b as 16 + 4 MiB (kept with the
        // part before); the three small pieces packed in the last part.
        assert_eq!(sizes, vec![PART, 16 * mib + 4, 20 * mib, 3 * mib]);
        let segments: Vec<usize> = parts.iter().map(|p| p.as_ref().len()).collect();
        assert_eq!(segments, vec![2, 1, 1, 3]);
        assert!(sizes[..sizes.len() - 1]
            .iter()
            .all(|&s| (MIN_PART..=PART + MIN_PART).contains(&s)));
        let joined: Vec<u8> = parts
            .iter()
            .flat_map(|p| p.iter().flat_map(|b| b.to_vec()).collect::<Vec<u8>>())
            .collect();
        let want: Vec<u8> = pieces.iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(joined, want);
        // Zero copy: the first part's second piece points into `a`.
        assert_eq!(parts[0].as_ref()[1].as_ptr(), a.as_ptr());
        assert_eq!(cut(&[]).len(), 1);
    }
}
