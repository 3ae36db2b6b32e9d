//! Parquet files (one, a list, or a glob; local or in object storage), read
//! with the `parquet` crate. Columns:
//! - a primitive column: one value per record;
//! - a fixed-size list of a primitive: a vector per record;
//! - with `seq_len`: exactly one column, a list of integers (token ids),
//!   packed: the lists of every row are concatenated into one token stream
//!   and cut into windows of `seq_len + 1` tokens starting every `seq_len`
//!   tokens, exactly as a token file is; the tail shorter than a window is
//!   dropped, and row boundaries are not marked (append an end-of-document
//!   token to each row when writing the data if the model needs one).
//!
//! Memory: when the chosen columns, decoded, fit in `max_memory`, they are
//! decoded once at open into contiguous buffers and records are copied out
//! of them. A larger data set is read lazily ([`lazy`]): a batch's records
//! are read straight from the pages that hold them, and packed token
//! streams a row group at a time through an LRU of decoded row groups
//! bounded by `max_memory`. Records and their order are the same either
//! way.

mod columns;
mod index;
mod io;
mod lazy;

use std::sync::Arc;

use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::PageIndexPolicy;

use self::columns::{append_column, has_nulls, kind_of, Kind};
use self::io::BlobReader;
use super::{fingerprint, Field, Source};
use crate::blob::{is_url, Blob, CacheConfig};
use crate::error::DataError;

/// The default of `max_memory`: decoded columns held by one source.
pub const DEFAULT_MAX_MEMORY: u64 = 512 << 20;

pub struct ParquetSource {
    fields: Vec<Field>,
    records: u64,
    /// With packing: the window length in tokens (`seq_len`).
    window: Option<u64>,
    fingerprint: String,
    data: Data,
    cache: CacheConfig,
}

enum Data {
    /// Every chosen column decoded, one buffer each.
    Held(Vec<Vec<u8>>),
    Lazy(lazy::Lazy),
}

/// One file, opened: its bytes, metadata (with the page index when it has
/// one) and the chosen columns.
pub(super) struct File {
    name: String,
    reader: BlobReader,
    meta: ArrowReaderMetadata,
    mask: ProjectionMask,
    /// The physical columns under the chosen ones (their chunks and pages
    /// are what a read fetches).
    leaves: Vec<usize>,
}

impl File {
    fn builder(&self) -> ParquetRecordBatchReaderBuilder<BlobReader> {
        ParquetRecordBatchReaderBuilder::new_with_metadata(self.reader.clone(), self.meta.clone())
            .with_projection(self.mask.clone())
    }

    /// Decodes row group `group` whole, appending each chosen column's
    /// values to `out`.
    fn decode_group(
        &self,
        group: usize,
        kinds: &[Kind],
        columns: &[String],
        out: &mut [Vec<u8>],
    ) -> Result<u64, DataError> {
        let ranges = io::chunk_ranges(self.meta.metadata(), group, &self.leaves);
        self.reader.0.fetch(&ranges)?;
        let reader = self
            .builder()
            .with_row_groups(vec![group])
            .with_batch_size(self.batch_rows(group))
            .build()
            .map_err(|e| parquet_error(&self.name, e))?;
        let mut rows = 0;
        for batch in reader {
            let batch = batch.map_err(|e| parquet_error(&self.name, e))?;
            for (c, kind) in kinds.iter().enumerate() {
                let array = batch.column(c);
                if has_nulls(array) {
                    return Err(parquet_error(
                        &self.name,
                        format!("column '{}' has null values", columns[c]),
                    ));
                }
                append_column(&mut out[c], array, kind);
            }
            rows += batch.num_rows() as u64;
        }
        Ok(rows)
    }

    /// Fetches the chosen columns of every row group at once (remote files;
    /// a no-op locally), so that a pass over the whole file is not a GET
    /// per row group in turn. A file larger than half the block cache is
    /// left to each row group's own fetch (it would evict itself).
    fn prefetch_all(&self) -> Result<(), DataError> {
        if self.reader.0.len() > self.reader.0.cache_room() / 2 {
            return Ok(());
        }
        let ranges: Vec<_> = (0..self.groups())
            .flat_map(|g| io::chunk_ranges(self.meta.metadata(), g, &self.leaves))
            .collect();
        self.reader.0.fetch(&ranges)
    }

    /// Rows decoded at a time: about 1 MiB of the chosen columns, so that
    /// decoding a row group holds little besides its output.
    fn batch_rows(&self, group: usize) -> usize {
        let rg = self.meta.metadata().row_group(group);
        let bytes: i64 = self
            .leaves
            .iter()
            .map(|&c| rg.column(c).uncompressed_size())
            .sum();
        let per_row = (bytes.max(1) as u64).div_ceil(rg.num_rows().max(1) as u64);
        usize::try_from((1u64 << 20) / per_row)
            .unwrap_or(usize::MAX)
            .clamp(16, 64 * 1024)
    }

    /// At least how many values the chosen columns hold in row group
    /// `group`, from the metadata alone: each row's levels count one
    /// value even when its list is empty.
    fn min_values(&self, group: usize) -> u64 {
        let rg = self.meta.metadata().row_group(group);
        let rows = rg.num_rows().max(0) as u64;
        self.leaves
            .iter()
            .map(|&c| (rg.column(c).num_values().max(0) as u64).saturating_sub(rows))
            .sum()
    }

    fn groups(&self) -> usize {
        self.meta.metadata().num_row_groups()
    }

    fn group_rows(&self, group: usize) -> u64 {
        self.meta.metadata().row_group(group).num_rows() as u64
    }
}

pub(super) fn parquet_error(path: &str, e: impl std::fmt::Display) -> DataError {
    DataError::Parquet {
        path: path.to_string(),
        message: e.to_string(),
    }
}

/// Expands globs (locally, or over a listing of the store); plain paths
/// and URLs must exist. Returns each file with its size when a listing
/// gave it.
pub fn expand(patterns: &[String]) -> Result<Vec<(String, Option<u64>)>, DataError> {
    let mut out = Vec::new();
    for p in patterns {
        let is_glob = p.contains(['*', '?', '[']);
        if is_glob && is_url(p) {
            out.extend(expand_remote(p)?);
        } else if is_glob {
            let mut matched: Vec<String> = glob::glob(p)
                .map_err(|e| DataError::NoMatch(format!("{p} ({e})")))?
                .filter_map(Result::ok)
                .map(|path| path.display().to_string())
                .collect();
            if matched.is_empty() {
                return Err(DataError::NoMatch(p.clone()));
            }
            matched.sort();
            out.extend(matched.into_iter().map(|m| (m, None)));
        } else {
            if !is_url(p) {
                super::check_exists(std::path::Path::new(p))?;
            }
            out.push((p.clone(), None));
        }
    }
    if out.is_empty() {
        return Err(DataError::Empty("no Parquet files given".into()));
    }
    Ok(out)
}

/// `s3://bucket/prefix/*.parquet`: the objects under the part before the
/// first wildcard whose URL matches, in name order.
fn expand_remote(pattern: &str) -> Result<Vec<(String, Option<u64>)>, DataError> {
    let wild = pattern.find(['*', '?', '[']).expect("a glob");
    let base = pattern[..wild].rsplit_once('/').map_or("", |(b, _)| b);
    let glob =
        glob::Pattern::new(pattern).map_err(|e| DataError::NoMatch(format!("{pattern} ({e})")))?;
    let meshrun_store::Location::Remote(dir) = meshrun_store::Location::parse(base)? else {
        unreachable!("a URL is remote")
    };
    let mut matched: Vec<(String, Option<u64>)> = dir
        .client
        .list(&dir.key)?
        .into_iter()
        .map(|(key, size)| (dir.client.url(&key), Some(size)))
        .filter(|(url, _)| {
            glob.matches_with(
                url,
                glob::MatchOptions {
                    require_literal_separator: true,
                    ..glob::MatchOptions::new()
                },
            )
        })
        .collect();
    if matched.is_empty() {
        return Err(DataError::NoMatch(pattern.to_string()));
    }
    matched.sort();
    Ok(matched)
}

/// What `ParquetSource::open` takes besides the files and columns.
pub struct ParquetOptions {
    pub seq_len: Option<u64>,
    /// Bytes of decoded columns the source may hold.
    pub max_memory: u64,
    pub cache: CacheConfig,
}

impl ParquetSource {
    pub fn open(
        patterns: &[String],
        columns: &[String],
        options: ParquetOptions,
    ) -> Result<Self, DataError> {
        let ParquetOptions {
            seq_len,
            max_memory,
            cache,
        } = options;
        let names = expand(patterns)?;
        if columns.is_empty() {
            return Err(DataError::Empty("no columns chosen".into()));
        }
        if let Some(0) = seq_len {
            return Err(DataError::BadSeqLen(0));
        }
        let packing = seq_len.is_some();
        if packing && columns.len() != 1 {
            return Err(DataError::BadColumnType {
                path: names[0].0.clone(),
                column: columns.join(", "),
                found: format!("{} columns", columns.len()),
                hint: "packing with seq_len takes exactly one token-list column",
            });
        }
        let total: u64 = names.iter().filter_map(|(_, size)| *size).sum();
        let mut files = Vec::with_capacity(names.len());
        let mut kinds: Option<Vec<Kind>> = None;
        for (name, _) in &names {
            let (file, file_kinds) = open_file(name, columns, packing, &cache, total)?;
            match &kinds {
                None => kinds = Some(file_kinds),
                Some(k) if *k != file_kinds => {
                    return Err(parquet_error(
                        name,
                        "its columns' types differ from the first file's",
                    ))
                }
                Some(_) => {}
            }
            files.push(file);
        }
        let kinds = kinds.expect("at least one file");
        let description = format!("parquet:{columns:?}:{seq_len:?}");
        let blobs: Vec<&Blob> = files.iter().map(|f| &*f.reader.0).collect();
        let fingerprint = fingerprint(&description, &blobs)?;
        let record_bytes: u64 = kinds
            .iter()
            .map(|k| match k {
                Kind::Scalar(d) | Kind::Tokens(d) => d.itemsize() as u64,
                Kind::Vector(d, n) => (d.itemsize() * n) as u64,
            })
            .sum();
        let (data, count) = if let Some(seq_len) = seq_len {
            let Kind::Tokens(d) = kinds[0] else {
                unreachable!("packing takes token lists")
            };
            let (counted, tokens) =
                index::tokens(&files, &kinds, columns, &fingerprint, max_memory)?;
            if tokens < seq_len + 1 {
                return Err(DataError::TooShort {
                    path: patterns.join(", "),
                    have: tokens,
                    need: seq_len + 1,
                });
            }
            let data = match counted {
                index::Counted::Held(buffer) => Data::Held(vec![buffer]),
                index::Counted::Groups(groups) => Data::Lazy(lazy::Lazy::packed(
                    files,
                    &groups,
                    lazy::Packing {
                        kind: kinds[0].clone(),
                        column: columns[0].clone(),
                        itemsize: d.itemsize() as u64,
                        budget: max_memory,
                    },
                )?),
            };
            (data, (tokens - 1) / seq_len)
        } else {
            let rows: u64 = files
                .iter()
                .map(|f| (0..f.groups()).map(|g| f.group_rows(g)).sum::<u64>())
                .sum();
            if rows * record_bytes <= max_memory {
                let mut buffers = vec![Vec::new(); columns.len()];
                for f in &files {
                    f.prefetch_all()?;
                    for g in 0..f.groups() {
                        f.decode_group(g, &kinds, columns, &mut buffers)?;
                    }
                }
                (Data::Held(buffers), rows)
            } else {
                let lazy = lazy::Lazy::rows(files, kinds.clone(), columns.to_vec());
                (Data::Lazy(lazy), rows)
            }
        };
        if count == 0 {
            return Err(DataError::Empty(patterns.join(", ")));
        }
        let fields = match (&kinds[0], seq_len) {
            (Kind::Tokens(d), Some(seq_len)) => vec![Field {
                name: columns[0].clone(),
                dtype: *d,
                shape: vec![seq_len as usize + 1],
            }],
            _ => kinds
                .iter()
                .zip(columns)
                .map(|(k, name)| {
                    let (dtype, shape) = match k {
                        Kind::Scalar(d) => (*d, vec![]),
                        Kind::Vector(d, n) => (*d, vec![*n]),
                        Kind::Tokens(_) => unreachable!("tokens only with seq_len"),
                    };
                    Field {
                        name: name.clone(),
                        dtype,
                        shape,
                    }
                })
                .collect(),
        };
        Ok(Self {
            fields,
            records: count,
            window: seq_len,
            fingerprint,
            data,
            cache,
        })
    }

    /// Whether the data is read lazily (larger than `max_memory`).
    pub fn is_lazy(&self) -> bool {
        matches!(self.data, Data::Lazy(_))
    }
}

/// Opens one file: its metadata (with the page index, if written), and
/// the kinds of the chosen columns.
fn open_file(
    name: &str,
    columns: &[String],
    packing: bool,
    cache: &CacheConfig,
    total: u64,
) -> Result<(File, Vec<Kind>), DataError> {
    let reader = BlobReader(Arc::new(Blob::open(name, cache, total)?));
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    let meta = ArrowReaderMetadata::load(&reader, options).map_err(|e| parquet_error(name, e))?;
    let schema = Arc::clone(meta.schema());
    let mut roots = Vec::new();
    let mut kinds = Vec::new();
    for column in columns {
        let Ok(i) = schema.index_of(column) else {
            let available: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(DataError::MissingColumn {
                path: name.to_string(),
                column: column.clone(),
                available: available.join(", "),
            });
        };
        roots.push(i);
        kinds.push(kind_of(name, column, schema.field(i).data_type(), packing)?);
    }
    let parquet_schema = meta.metadata().file_metadata().schema_descr();
    let mask = ProjectionMask::roots(parquet_schema, roots.iter().copied());
    let leaves = io::leaves(parquet_schema, &roots);
    Ok((
        File {
            name: name.to_string(),
            reader,
            meta,
            mask,
            leaves,
        },
        kinds,
    ))
}

impl Source for ParquetSource {
    fn records(&self) -> u64 {
        self.records
    }

    fn fields(&self) -> &[Field] {
        &self.fields
    }

    fn read(&self, index: u64, out: &mut [&mut [u8]]) -> Result<(), DataError> {
        match (&self.data, self.window) {
            (Data::Held(columns), Some(seq_len)) => {
                let size = self.fields[0].dtype.itemsize();
                let start = (index * seq_len) as usize * size;
                let len = (seq_len as usize + 1) * size;
                out[0].copy_from_slice(&columns[0][start..start + len]);
            }
            (Data::Held(columns), None) => {
                for ((field, column), dst) in self.fields.iter().zip(columns).zip(out.iter_mut()) {
                    let n = field.record_bytes();
                    let start = index as usize * n;
                    dst.copy_from_slice(&column[start..start + n]);
                }
            }
            (Data::Lazy(lazy), Some(seq_len)) => {
                lazy.read_tokens(index * seq_len, out[0])?;
            }
            (Data::Lazy(_), None) => {
                let mut buffers: Vec<Vec<u8>> = self
                    .fields
                    .iter()
                    .map(|f| vec![0; f.record_bytes()])
                    .collect();
                self.read_rows(&[(0, index)], &mut buffers)?;
                for (dst, src) in out.iter_mut().zip(buffers) {
                    dst.copy_from_slice(&src);
                }
            }
        }
        Ok(())
    }

    fn read_rows(&self, rows: &[(usize, u64)], out: &mut [Vec<u8>]) -> Result<(), DataError> {
        match (&self.data, self.window) {
            (Data::Lazy(lazy), None) => lazy.read_rows(&self.fields, rows, out),
            _ => super::read_each(self, rows, out),
        }
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn fetched(&self) -> u64 {
        self.cache.fetched()
    }
}
