//! Uploading one rank's shard file: straight from the buffers it is made
//! of (the header, then each shard's bytes, as the caller holds them), as
//! one put when small, else as a multipart upload with up to
//! [`CONCURRENCY`](super::remote::CONCURRENCY) parts in flight. Parts are
//! slices of those buffers, never copies.

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};

use super::remote::{block, Client, CONCURRENCY};
use crate::error::CkptError;

/// Bytes in one part of a multipart upload (S3 wants 5 MiB at least, all
/// but the last). Larger parts mean fewer requests; this many in flight
/// keep a fast link busy.
pub const PART: usize = 16 << 20;

/// `parts` (each at most `PART` bytes) cut out of `pieces` without copying.
fn cut(pieces: &[Bytes]) -> Vec<PutPayload> {
    let mut out = Vec::new();
    let mut current: Vec<Bytes> = Vec::new();
    let mut size = 0;
    for piece in pieces {
        let mut rest = piece.clone();
        while !rest.is_empty() {
            let take = (PART - size).min(rest.len());
            current.push(rest.split_to(take));
            size += take;
            if size == PART {
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
pub fn upload_file(client: &Client, key: &Key, pieces: &[Bytes]) -> Result<(), CkptError> {
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
    result.map_err(|source| CkptError::Storage {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_full_slices_of_the_pieces_in_order() {
        let a = Bytes::from(vec![1u8; PART + 10]);
        let b = Bytes::from(vec![2u8; PART - 5]);
        let c = Bytes::from(vec![3u8; 3]);
        let parts = cut(&[Bytes::from_static(b"head"), a.clone(), b, c]);
        let sizes: Vec<usize> = parts.iter().map(PutPayload::content_length).collect();
        assert_eq!(sizes, vec![PART, PART, 12]);
        let joined: Vec<u8> = parts
            .iter()
            .flat_map(|p| p.iter().flat_map(|b| b.to_vec()).collect::<Vec<u8>>())
            .collect();
        assert_eq!(&joined[..4], b"head");
        assert_eq!(joined.len(), 4 + PART + 10 + PART - 5 + 3);
        assert_eq!(joined[joined.len() - 1], 3);
        // Zero copy: the first part's second piece points into `a`.
        assert_eq!(parts[0].as_ref()[1].as_ptr(), a.as_ptr());
        assert_eq!(cut(&[]).len(), 1);
    }
}
