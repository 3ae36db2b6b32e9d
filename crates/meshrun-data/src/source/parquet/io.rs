//! The Parquet reader's view of a [`Blob`]: footer and pages read by range,
//! through the block cache when the file is remote.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, Length};
use parquet::schema::types::SchemaDescriptor;

use crate::blob::{Blob, Cursor};

#[derive(Clone)]
pub struct BlobReader(pub Arc<Blob>);

impl Length for BlobReader {
    fn len(&self) -> u64 {
        self.0.len()
    }
}

impl ChunkReader for BlobReader {
    type T = Cursor;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Cursor> {
        Ok(Cursor::new(Arc::clone(&self.0), start))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.0
            .bytes(start, length)
            .map_err(|e| ParquetError::External(Box::new(e)))
    }
}

/// The byte ranges of the chosen columns' chunks in row group `group`.
pub fn chunk_ranges(meta: &ParquetMetaData, group: usize, leaves: &[usize]) -> Vec<Range<u64>> {
    let rg = meta.row_group(group);
    leaves
        .iter()
        .map(|&c| {
            let (start, len) = rg.column(c).byte_range();
            start..start + len
        })
        .collect()
}

/// The byte ranges a read of `rows` (sorted, within row group `group`)
/// needs of the chosen columns: each chunk's dictionary and the data pages
/// that hold those rows, when the file has an offset index; else the
/// whole chunks.
pub fn page_ranges(
    meta: &ParquetMetaData,
    group: usize,
    leaves: &[usize],
    rows: &[u64],
) -> Vec<Range<u64>> {
    let index = meta.page_index_for_row_group(group);
    let rg = meta.row_group(group);
    let mut out = Vec::new();
    for &c in leaves {
        let (chunk_start, chunk_len) = rg.column(c).byte_range();
        let Some(pages) = index.page_locations(c) else {
            out.push(chunk_start..chunk_start + chunk_len);
            continue;
        };
        let Some(first) = pages.first() else {
            out.push(chunk_start..chunk_start + chunk_len);
            continue;
        };
        // The dictionary page, if any, sits before the first data page.
        if (first.offset as u64) > chunk_start {
            out.push(chunk_start..first.offset as u64);
        }
        let mut r = rows.iter().peekable();
        for (i, page) in pages.iter().enumerate() {
            let end_row = pages
                .get(i + 1)
                .map_or(u64::MAX, |next| next.first_row_index as u64);
            while r
                .peek()
                .is_some_and(|&&row| row < page.first_row_index as u64)
            {
                r.next();
            }
            if r.peek().is_some_and(|&&row| row < end_row) {
                let at = page.offset as u64;
                out.push(at..at + page.compressed_page_size as u64);
            }
        }
    }
    out
}

/// The leaf (physical) columns under the chosen root columns.
pub fn leaves(schema: &SchemaDescriptor, roots: &[usize]) -> Vec<usize> {
    (0..schema.num_columns())
        .filter(|&c| roots.contains(&schema.get_column_root_idx(c)))
        .collect()
}
