//! Parquet data larger than `max_memory`, read as the order reaches it.
//!
//! Columns of records: a batch's records are grouped by row group, and
//! each row group is read with a row selection of just those rows; with a
//! page index (Arrow's writer makes one by default, pyarrow's with
//! `write_page_index=True`), only the pages that hold them are fetched and
//! decoded, so a shuffled order costs a page per record rather than a row
//! group (measured: 10x faster on 4 KiB records), and nothing decoded
//! outlives the batch.
//!
//! Packed tokens: a window's tokens are found by the row groups' token
//! counts ([`super::index`]); row groups are decoded whole (a row's place in
//! the stream needs the lengths of the rows before it) and kept in an LRU
//! bounded by `max_memory`. A shuffled order over data many times the
//! budget decodes a row group for most windows: give such data a larger
//! budget, smaller row groups, or a token file.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use lru::LruCache;
use parquet::arrow::arrow_reader::{RowSelection, RowSelectionPolicy, RowSelector};

use super::columns::{append_column, has_nulls, Kind};
use super::index::GroupCount;
use super::{io, parquet_error, File};
use crate::error::DataError;
use crate::source::Field;

pub struct Lazy {
    files: Vec<File>,
    groups: Vec<Group>,
    kinds: Vec<Kind>,
    columns: Vec<String>,
    packed: Option<Packed>,
}

/// A row group: its file, its index there, and where its rows (or tokens)
/// start in the data set.
struct Group {
    file: usize,
    index: usize,
    first: u64,
    count: u64,
}

pub struct Packing {
    pub kind: Kind,
    pub column: String,
    pub itemsize: u64,
    pub budget: u64,
}

struct Packed {
    itemsize: u64,
    budget: u64,
    held: Mutex<Held>,
}

/// Decoded row groups' tokens, and the bytes they hold.
type Held = (LruCache<usize, Arc<Vec<u8>>>, u64);

impl Lazy {
    pub fn rows(files: Vec<File>, kinds: Vec<Kind>, columns: Vec<String>) -> Self {
        let mut groups = Vec::new();
        let mut first = 0;
        for (f, file) in files.iter().enumerate() {
            for g in 0..file.groups() {
                let count = file.group_rows(g);
                groups.push(Group {
                    file: f,
                    index: g,
                    first,
                    count,
                });
                first += count;
            }
        }
        Self {
            files,
            groups,
            kinds,
            columns,
            packed: None,
        }
    }

    pub fn packed(
        files: Vec<File>,
        counts: &[GroupCount],
        packing: Packing,
    ) -> Result<Self, DataError> {
        let mut groups = Vec::with_capacity(counts.len());
        let mut first = 0;
        for c in counts {
            let bytes = c.tokens * packing.itemsize;
            if bytes > packing.budget {
                return Err(DataError::RowGroupTooLarge {
                    path: files[c.file].name.clone(),
                    group: c.group,
                    bytes,
                    budget: packing.budget,
                });
            }
            groups.push(Group {
                file: c.file,
                index: c.group,
                first,
                count: c.tokens,
            });
            first += c.tokens;
        }
        Ok(Self {
            files,
            groups,
            kinds: vec![packing.kind],
            columns: vec![packing.column],
            packed: Some(Packed {
                itemsize: packing.itemsize,
                budget: packing.budget,
                held: Mutex::new((LruCache::unbounded(), 0)),
            }),
        })
    }

    /// The row group holding row (or token) `at`.
    fn find(&self, at: u64) -> usize {
        self.groups.partition_point(|g| g.first + g.count <= at)
    }

    /// Copies `out.len()` bytes of the token stream from token `start`.
    pub fn read_tokens(&self, start: u64, out: &mut [u8]) -> Result<(), DataError> {
        let packed = self.packed.as_ref().expect("a packed data set");
        let mut at = start;
        let mut done = 0usize;
        while done < out.len() {
            let g = self.find(at);
            let tokens = self.group_tokens(packed, g)?;
            let offset = ((at - self.groups[g].first) * packed.itemsize) as usize;
            let n = (tokens.len() - offset).min(out.len() - done);
            out[done..done + n].copy_from_slice(&tokens[offset..offset + n]);
            done += n;
            at += n as u64 / packed.itemsize;
        }
        Ok(())
    }

    /// Row group `g`'s tokens: from the LRU, or decoded (without the lock
    /// held, so other threads read on) and added to it.
    fn group_tokens(&self, packed: &Packed, g: usize) -> Result<Arc<Vec<u8>>, DataError> {
        if let Some(t) = packed.held.lock().expect("lru lock").0.get(&g) {
            return Ok(Arc::clone(t));
        }
        let group = &self.groups[g];
        // The exact size, known from the index: one allocation, not a
        // doubling series the allocator would keep around.
        let mut out = vec![Vec::with_capacity(
            usize::try_from(group.count * packed.itemsize).expect("a row group fits in memory"),
        )];
        self.files[group.file].decode_group(group.index, &self.kinds, &self.columns, &mut out)?;
        let tokens = Arc::new(out.pop().expect("one column"));
        let mut held = packed.held.lock().expect("lru lock");
        if held.0.put(g, Arc::clone(&tokens)).is_none() {
            held.1 += tokens.len() as u64;
        }
        while held.1 > packed.budget && held.0.len() > 1 {
            let (_, gone) = held.0.pop_lru().expect("more than one");
            held.1 -= gone.len() as u64;
        }
        Ok(tokens)
    }

    /// Reads `(row, record)` pairs into their rows of `out` (one buffer per
    /// field), reading each row group touched once, for just those records.
    pub fn read_rows(
        &self,
        fields: &[Field],
        rows: &[(usize, u64)],
        out: &mut [Vec<u8>],
    ) -> Result<(), DataError> {
        // Row group -> (row within it, row of the batch), sorted.
        let mut by_group: BTreeMap<usize, Vec<(u64, usize)>> = BTreeMap::new();
        for &(slot, record) in rows {
            let g = self.find(record);
            by_group
                .entry(g)
                .or_default()
                .push((record - self.groups[g].first, slot));
        }
        for wanted in by_group.values_mut() {
            wanted.sort_unstable();
        }
        // Everything the batch needs is fetched at once, file by file.
        let mut ranges: Vec<Vec<std::ops::Range<u64>>> = vec![Vec::new(); self.files.len()];
        for (&g, wanted) in &by_group {
            let group = &self.groups[g];
            let file = &self.files[group.file];
            let rows: Vec<u64> = wanted.iter().map(|w| w.0).collect();
            ranges[group.file].extend(io::page_ranges(
                file.meta.metadata(),
                group.index,
                &file.leaves,
                &rows,
            ));
        }
        for (file, r) in self.files.iter().zip(&ranges) {
            if !r.is_empty() {
                file.reader.0.prefetch(r)?;
            }
        }
        let sizes: Vec<usize> = fields.iter().map(Field::record_bytes).collect();
        for (&g, wanted) in &by_group {
            self.read_group(g, wanted, &sizes, out)?;
        }
        Ok(())
    }

    fn read_group(
        &self,
        g: usize,
        wanted: &[(u64, usize)],
        sizes: &[usize],
        out: &mut [Vec<u8>],
    ) -> Result<(), DataError> {
        let group = &self.groups[g];
        let file = &self.files[group.file];
        let mut unique: Vec<u64> = wanted.iter().map(|w| w.0).collect();
        unique.dedup();
        let reader = file
            .builder()
            .with_row_groups(vec![group.index])
            .with_row_selection(selection(&unique, group.count))
            .with_row_selection_policy(RowSelectionPolicy::Selectors)
            .with_batch_size(unique.len().max(1))
            .build()
            .map_err(|e| parquet_error(&file.name, e))?;
        // `wanted` is sorted by row, so the decoded rows (in row order)
        // meet their batch rows in one pass.
        let mut next = 0usize;
        let mut decoded = 0usize;
        let mut values: Vec<Vec<u8>> = vec![Vec::new(); self.kinds.len()];
        for batch in reader {
            let batch = batch.map_err(|e| parquet_error(&file.name, e))?;
            for (c, kind) in self.kinds.iter().enumerate() {
                let array = batch.column(c);
                if has_nulls(array) {
                    return Err(parquet_error(
                        &file.name,
                        format!("column '{}' has null values", self.columns[c]),
                    ));
                }
                values[c].clear();
                append_column(&mut values[c], array, kind);
            }
            for k in 0..batch.num_rows() {
                let row = unique[decoded + k];
                while next < wanted.len() && wanted[next].0 == row {
                    let slot = wanted[next].1;
                    for (c, &size) in sizes.iter().enumerate() {
                        out[c][slot * size..(slot + 1) * size]
                            .copy_from_slice(&values[c][k * size..(k + 1) * size]);
                    }
                    next += 1;
                }
            }
            decoded += batch.num_rows();
        }
        if decoded != unique.len() {
            return Err(parquet_error(
                &file.name,
                format!(
                    "row group {} gave {decoded} of the {} rows asked for",
                    group.index,
                    unique.len()
                ),
            ));
        }
        Ok(())
    }
}

/// The selection of `rows` (sorted, distinct) out of `total`, as runs.
fn selection(rows: &[u64], total: u64) -> RowSelection {
    let mut selectors = Vec::new();
    let mut at = 0u64;
    let mut i = 0;
    while i < rows.len() {
        let start = rows[i];
        let mut end = start + 1;
        i += 1;
        while i < rows.len() && rows[i] == end {
            end += 1;
            i += 1;
        }
        if start > at {
            selectors.push(RowSelector::skip((start - at) as usize));
        }
        selectors.push(RowSelector::select((end - start) as usize));
        at = end;
    }
    if total > at {
        selectors.push(RowSelector::skip((total - at) as usize));
    }
    selectors.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_is_runs_of_the_rows() {
        let s = selection(&[0, 1, 2, 5, 9], 12);
        let want: RowSelection = vec![
            RowSelector::select(3),
            RowSelector::skip(2),
            RowSelector::select(1),
            RowSelector::skip(3),
            RowSelector::select(1),
            RowSelector::skip(2),
        ]
        .into();
        assert_eq!(s, want);
    }
}
