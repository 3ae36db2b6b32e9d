//! The object-store client behind a remote [`crate::Location`]: one per
//! bucket, made from the environment, with the few operations the engine
//! needs, each run to completion on meshrun's own storage runtime so that
//! callers stay synchronous (the controller's loop and Python's threads
//! alike).

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientConfigKey, GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig,
};

use crate::error::StoreError;

/// Requests in flight for one read or one upload.
pub const CONCURRENCY: usize = 16;

/// How long a failing request is retried before the operation fails: a
/// storage server that is down fails a save within this, instead of the
/// client's default of minutes.
const RETRY_FOR: Duration = Duration::from_secs(15);

pub struct Client {
    store: Arc<dyn ObjectStore>,
    bucket_url: String,
    /// S3 only: what lists and aborts unfinished multipart uploads.
    uploads: Option<crate::uploads::S3Uploads>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Client({})", self.bucket_url)
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("meshrun-storage")
            // In a Python process, signals are Python's main thread's to
            // take: a storage thread that took one would leave it pending
            // (CPython 3.11 marks it for the main thread only when its
            // handler runs there).
            .on_thread_start(block_signals)
            .enable_all()
            .build()
            .expect("the storage runtime starts")
    })
}

/// Runs `fut` on the storage runtime and waits for it. Safe to call from
/// inside another tokio runtime (the controller's), where `block_on` of a
/// runtime would panic. The result comes back through a plain channel:
/// polling the task's `JoinHandle` from a thread inside another runtime
/// would spend that runtime's cooperative budget, which nothing there
/// renews while this thread waits, and spin forever.
pub fn block<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().expect("a storage task panicked")
}

fn block_signals() {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None);
}

fn clients() -> &'static Mutex<HashMap<String, Arc<Client>>> {
    static CLIENTS: OnceLock<Mutex<HashMap<String, Arc<Client>>>> = OnceLock::new();
    CLIENTS.get_or_init(Mutex::default)
}

fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 5,
        retry_timeout: RETRY_FOR,
    }
}

/// The S3 client of bucket `url`; `bad` makes the error of a setting the
/// builder refuses.
fn s3(
    url: &str,
    bad: impl Fn(String) -> StoreError,
) -> Result<(Arc<dyn ObjectStore>, crate::uploads::S3Uploads), StoreError> {
    let builder = crate::credentials::apply_profile(AmazonS3Builder::from_env());
    let mut builder = crate::credentials::require_source(builder)?
        .with_url(url)
        .with_retry(retry())
        .with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
            "5s",
        )
        .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "120s");
    let endpoint = builder
        .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
        .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
    if let Some(endpoint) = endpoint {
        // An on-premises store given as http://host:port means plain HTTP.
        if endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
        // Such stores have one region, whatever its name; AWS itself is
        // found by name without one.
        if builder
            .get_config_value(&AmazonS3ConfigKey::Region)
            .is_none()
            && builder
                .get_config_value(&AmazonS3ConfigKey::DefaultRegion)
                .is_none()
        {
            builder = builder.with_region("us-east-1");
        }
    }
    let region = builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::DefaultRegion))
        .unwrap_or_else(|| "us-east-1".to_string());
    // `with_url` sets the bucket only when the store is built.
    let bucket = url.split_once("://").map_or(url, |(_, b)| b);
    let bucket_http = match builder
        .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
        .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint))
    {
        Some(endpoint) => format!("{}/{bucket}", endpoint.trim_end_matches('/')),
        None => format!("https://s3.{region}.amazonaws.com/{bucket}"),
    };
    let s3 = Arc::new(builder.build().map_err(|e| bad(e.to_string()))?);
    let uploads = crate::uploads::S3Uploads {
        s3: Arc::clone(&s3),
        bucket_http,
        region,
        http: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_mins(1))
            .build()
            .map_err(|e| bad(e.to_string()))?,
    };
    Ok((s3, uploads))
}

impl Client {
    /// The client of `url`'s bucket (made once per process) and the key
    /// prefix `url` names in it.
    pub fn for_url(url: &str) -> Result<(Arc<Client>, Key), StoreError> {
        let bad = |reason: String| StoreError::BadUrl {
            url: url.to_string(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let bucket = parsed
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| bad("it names no bucket".into()))?;
        let bucket_url = format!("{}://{bucket}", parsed.scheme());
        let key = Key::parse(parsed.path().trim_matches('/')).map_err(|e| bad(e.to_string()))?;
        let mut known = clients().lock().expect("clients lock");
        if let Some(c) = known.get(&bucket_url) {
            return Ok((Arc::clone(c), key));
        }
        let mut uploads = None;
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            "s3" | "s3a" => {
                let (store, u) = s3(&bucket_url, bad)?;
                uploads = Some(u);
                Ok(store)
            }
            "gs" => object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(&bucket_url)
                .with_retry(retry())
                .build()
                .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            "az" | "abfs" | "abfss" | "azure" => {
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(&bucket_url)
                    .with_retry(retry())
                    .build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
            }
            other => {
                return Err(bad(format!(
                    "scheme '{other}://' is not supported; use {}",
                    crate::SCHEMES
                )))
            }
        }
        .map_err(|e| bad(e.to_string()))?;
        let client = Arc::new(Client {
            store,
            bucket_url: bucket_url.clone(),
            uploads,
        });
        known.insert(bucket_url, Arc::clone(&client));
        Ok((client, key))
    }

    /// `s3://bucket`.
    pub fn bucket_url(&self) -> &str {
        &self.bucket_url
    }

    pub fn url(&self, key: &Key) -> String {
        format!("{}/{key}", self.bucket_url)
    }

    pub fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    fn fail(
        &self,
        what: &'static str,
        key: &Key,
    ) -> impl FnOnce(object_store::Error) -> StoreError {
        let url = self.url(key);
        move |source| StoreError::Storage {
            what,
            url,
            source: Box::new(source),
        }
    }

    /// The whole object, or `None` if there is none.
    pub fn get(&self, key: &Key) -> Result<Option<Bytes>, StoreError> {
        let store = self.store();
        let k = key.clone();
        match block(async move { store.get(&k).await?.bytes().await }) {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.fail("cannot read", key)(e)),
        }
    }

    /// The size of an object, or `None` if there is none.
    pub fn size(&self, key: &Key) -> Result<Option<u64>, StoreError> {
        let store = self.store();
        let k = key.clone();
        match block(async move { store.head(&k).await }) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.fail("cannot read", key)(e)),
        }
    }

    /// The first `len` bytes of an object and the object's size.
    pub fn get_head(&self, key: &Key, len: u64) -> Result<(Bytes, u64), StoreError> {
        let store = self.store();
        let k = key.clone();
        block(async move {
            let opts = GetOptions {
                range: Some((0..len).into()),
                ..GetOptions::default()
            };
            let got = store.get_opts(&k, opts).await?;
            let size = got.meta.size;
            Ok((got.bytes().await?, size))
        })
        .map_err(|e| match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound { url: self.url(key) },
            e => self.fail("cannot read", key)(e),
        })
    }

    /// Byte ranges of one object, `CONCURRENCY` requests in flight, in
    /// the order asked.
    pub fn get_ranges(&self, key: &Key, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>, StoreError> {
        self.get_many(ranges.into_iter().map(|r| (key.clone(), r)).collect())
    }

    /// Byte ranges of any objects, `CONCURRENCY` requests in flight, in the
    /// order asked.
    pub fn get_many(&self, requests: Vec<(Key, Range<u64>)>) -> Result<Vec<Bytes>, StoreError> {
        let store = self.store();
        block(async move {
            futures::stream::iter(requests)
                .map(|(k, r)| {
                    let store = Arc::clone(&store);
                    async move { store.get_range(&k, r).await.map_err(|e| (k, e)) }
                })
                .buffered(CONCURRENCY)
                .try_collect::<Vec<Bytes>>()
                .await
        })
        .map_err(|(key, e)| match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound {
                url: self.url(&key),
            },
            e => self.fail("cannot read", &key)(e),
        })
    }

    /// Byte ranges of any objects, `CONCURRENCY` requests in flight, each
    /// handed to `each` (with its index in `requests`) on the calling thread
    /// as soon as it arrives, so that what the caller does with one (write
    /// it to a cache) overlaps the fetching of the others. An error from
    /// `each` stops the fetching. Not for use inside an async context (it
    /// blocks the thread while it waits).
    pub fn get_each<E: From<StoreError>>(
        &self,
        requests: Vec<(Key, Range<u64>)>,
        mut each: impl FnMut(usize, Bytes) -> Result<(), E>,
    ) -> Result<(), E> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(CONCURRENCY);
        let store = self.store();
        runtime().spawn(async move {
            let mut arrivals = futures::stream::iter(requests.into_iter().enumerate())
                .map(|(i, (k, r))| {
                    let store = Arc::clone(&store);
                    async move { (i, store.get_range(&k, r).await.map_err(|e| (k, e))) }
                })
                .buffer_unordered(CONCURRENCY);
            while let Some(item) = arrivals.next().await {
                // The caller gave up (its own error): stop fetching.
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        });
        while let Some((i, got)) = rx.blocking_recv() {
            match got {
                Ok(body) => each(i, body)?,
                Err((key, e)) => {
                    return Err(match e {
                        object_store::Error::NotFound { .. } => StoreError::NotFound {
                            url: self.url(&key),
                        },
                        e => self.fail("cannot read", &key)(e),
                    }
                    .into())
                }
            }
        }
        Ok(())
    }

    pub fn put(&self, key: &Key, data: Bytes) -> Result<(), StoreError> {
        let store = self.store();
        let k = key.clone();
        block(async move { store.put(&k, PutPayload::from(data)).await.map(drop) })
            .map_err(self.fail("cannot write", key))
    }

    /// Writes `data` only if no object `key` exists: `Ok(false)` if one does.
    pub fn put_new(&self, key: &Key, data: Bytes) -> Result<bool, StoreError> {
        let store = self.store();
        let k = key.clone();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match block(async move { store.put_opts(&k, PutPayload::from(data), opts).await }) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(self.fail("cannot write", key)(e)),
        }
    }

    /// Every object under `prefix` (recursively): key and size.
    pub fn list(&self, prefix: &Key) -> Result<Vec<(Key, u64)>, StoreError> {
        let store = self.store();
        let p = prefix.clone();
        block(async move {
            store
                .list(Some(&p))
                .map_ok(|m| (m.location, m.size))
                .try_collect::<Vec<_>>()
                .await
        })
        .map_err(self.fail("cannot list", prefix))
    }

    pub fn delete(&self, keys: Vec<Key>) -> Result<(), StoreError> {
        let store = self.store();
        let first = keys.first().cloned().unwrap_or_default();
        block(async move {
            let stream = futures::stream::iter(keys.into_iter().map(Ok)).boxed();
            store
                .delete_stream(stream)
                .try_for_each(|_| async { Ok(()) })
                .await
        })
        .map_err(self.fail("cannot delete", &first))
    }

    /// Aborts the unfinished multipart uploads under `prefix` (S3 only;
    /// other stores keep no parts of an upload nobody finished). Returns
    /// their keys.
    pub fn abort_uploads(self: &Arc<Self>, prefix: &Key) -> Result<Vec<String>, StoreError> {
        if self.uploads.is_none() {
            return Ok(Vec::new());
        }
        let me = Arc::clone(self);
        let p = prefix.to_string();
        block(async move {
            let uploads = me.uploads.as_ref().expect("checked");
            uploads.abort_all(&format!("{p}/")).await
        })
        .map_err(self.fail("cannot list the unfinished uploads under", prefix))
    }

    pub fn copy(&self, from: &Key, to: &Key) -> Result<(), StoreError> {
        let store = self.store();
        let (f, t) = (from.clone(), to.clone());
        block(async move { store.copy(&f, &t).await }).map_err(self.fail("cannot copy", from))
    }
}

/// Writes, reads back and deletes a small object in `dir`: what a run
/// needs of its storage, tried before it starts.
pub fn probe(dir: &crate::RemoteDir) -> Result<(), StoreError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let key = dir.object(&format!(".meshrun-probe-{}-{nanos}", std::process::id()));
    let body = Bytes::from_static(b"meshrun");
    dir.client.put(&key, body.clone())?;
    let back = dir.client.get(&key)?;
    dir.client.delete(vec![key.clone()])?;
    if back.as_ref() == Some(&body) {
        Ok(())
    } else {
        Err(StoreError::Storage {
            what: "cannot read back",
            url: dir.client.url(&key),
            source: Box::new(object_store::Error::Generic {
                store: "meshrun",
                source: "the object read back is not the one written".into(),
            }),
        })
    }
}
