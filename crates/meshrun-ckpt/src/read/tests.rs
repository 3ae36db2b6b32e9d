use super::*;
use crate::commit::{commit, committed, tmp_dir};
use crate::manifest::{Leaf, FORMAT_VERSION};
use crate::shard::{write_rank_file, ShardIn};
use bytes::Bytes;

/// Saves an (8, 6) float32 leaf as 4 row blocks over 2 "ranks", then
/// reads it back by columns, whole, and as one element.
#[test]
fn resharded_reads_and_crc_detection() {
    let root = tempfile::tempdir().unwrap();
    let values: Vec<f32> = (0..48).map(|i| i as f32 * 0.5).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tmp = tmp_dir(root.path(), 7);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut leaf = Leaf {
        path: "w".into(),
        dtype: "float32".into(),
        shape: vec![8, 6],
        shards: vec![],
    };
    for rank in 0..2u32 {
        let shards: Vec<ShardIn> = (0..2)
            .map(|k| {
                let r = (rank * 2 + k) as usize;
                ShardIn {
                    leaf: "w".into(),
                    dtype: "float32".into(),
                    region: vec![(r * 2, r * 2 + 2), (0, 6)],
                    data: Bytes::copy_from_slice(&bytes[r * 48..(r + 1) * 48]),
                    per_process: false,
                }
            })
            .collect();
        leaf.shards.extend(
            write_rank_file(&tmp, rank, &shards)
                .unwrap()
                .into_iter()
                .map(|(_, s)| s),
        );
    }
    let manifest = Manifest {
        format: FORMAT_VERSION,
        step: 7,
        leaves: vec![leaf],
        files: vec![],
        extra: serde_json::json!({}),
        attempt: None,
    };
    let dir = commit(&root.path().into(), &manifest).unwrap();
    assert_eq!(
        committed(&root.path().into()).unwrap(),
        vec![(7, dir.clone())]
    );

    let mut reader = Reader::open(&dir).unwrap();
    let mut whole = vec![0u8; 48 * 4];
    reader
        .read_region("w", &[(0, 8), (0, 6)], &mut whole)
        .unwrap();
    assert_eq!(whole, bytes);
    let mut cols = vec![0u8; 8 * 2 * 4];
    reader
        .read_region("w", &[(0, 8), (3, 5)], &mut cols)
        .unwrap();
    let got: Vec<f32> = cols
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<f32> = (0..8)
        .flat_map(|r| [values[r * 6 + 3], values[r * 6 + 4]])
        .collect();
    assert_eq!(got, want);
    assert_eq!(reader.verify_all().unwrap(), 4);

    // Flip one byte of rank 1's data: verify and reads of it fail, naming
    // the file and the tensor; reads of rank 0's rows still work.
    let file = dir.local().unwrap().join("rank-1.safetensors");
    let mut raw = std::fs::read(&file).unwrap();
    let n = raw.len();
    raw[n - 3] ^= 0xff;
    std::fs::write(&file, raw).unwrap();
    let mut reader = Reader::open(&dir).unwrap();
    let err = reader.verify_all().unwrap_err().to_string();
    assert!(
        err.contains("rank-1.safetensors") && err.contains("tensor 'w:1'"),
        "{err}"
    );
    let mut top = vec![0u8; 2 * 6 * 4];
    reader
        .read_region("w", &[(0, 2), (0, 6)], &mut top)
        .unwrap();
    let err = reader
        .read_region("w", &[(6, 8), (0, 6)], &mut top)
        .unwrap_err()
        .to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
}
