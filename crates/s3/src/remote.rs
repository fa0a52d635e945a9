//! The bucket: object names, requests through the `object_store` crate
//! (timeouts and retries with backoff are its), and counters of what was
//! asked of it.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig,
};

use crate::manifest::Piece;
use crate::S3Url;

/// Counters of requests and traffic.
#[derive(Default, Debug)]
pub struct Counters {
    /// HTTP attempts that failed (an error, or status 429 or 5xx): each
    /// was retried, or ended its request with an error.
    pub failed_attempts: AtomicU64,
    pub puts: AtomicU64,
    pub gets: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The HTTP client, counting failed attempts (the `object_store` crate
/// retries them; it does not say how often).
#[derive(Debug)]
struct Counting {
    inner: HttpClient,
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl HttpService for Counting {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let r = self.inner.execute(req).await;
        let failed = match &r {
            Ok(resp) => resp.status().is_server_error() || resp.status().as_u16() == 429,
            Err(_) => true,
        };
        if failed {
            add(&self.counters.failed_attempts, 1);
        }
        r
    }
}

#[derive(Debug)]
struct CountingConnector(Arc<Counters>);

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Counting { inner, counters: Arc::clone(&self.0) }))
    }
}

/// How a create-only upload ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Created {
    /// The object is ours (created now, or by an earlier try of this
    /// request that the client retried: same bytes).
    Yes,
    /// Another writer created it first, with other bytes.
    Taken,
}

/// One image's objects in a bucket.
pub struct Remote {
    rt: tokio::runtime::Runtime,
    os: Arc<dyn ObjectStore>,
    prefix: Key,
    url: S3Url,
    pub counters: Arc<Counters>,
    /// How long a request is retried before it fails.
    retry_for: Duration,
}

fn io_err(what: &str, e: object_store::Error) -> io::Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("{what}: {e}"))
}

/// The server's address (`endpoint`, else AWS_ENDPOINT_URL or
/// AWS_ENDPOINT from the environment) must be an http or https URL: the
/// client takes one without a scheme (`127.0.0.1:5000`) as a relative
/// path and fails deep inside.
fn check_endpoint(endpoint: Option<&str>) -> io::Result<()> {
    let (e, from) = match endpoint {
        Some(e) => (e.to_string(), "the endpoint"),
        None => {
            match ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"].iter().find_map(|v| Some((std::env::var(v).ok()?, *v)))
            {
                Some((e, v)) => (e, v),
                None => return Ok(()),
            }
        }
    };
    let host = e.strip_prefix("http://").or_else(|| e.strip_prefix("https://"));
    match host {
        Some(h) if !h.is_empty() && !h.starts_with('/') => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{from} {e:?} is not an http:// or https:// URL (for example http://127.0.0.1:5000)"),
        )),
    }
}

/// A create-only PUT, tried again after any failure but a refusal until
/// `retry_for` has passed since the first try. The client retries a
/// timed-out or cut request only when it is idempotent, and a
/// create-only PUT is not marked so; here it is safe to repeat: a repeat
/// that finds the object there reads it back and takes it as ours when
/// the bytes are the same ([`Remote::put_many`]).
async fn put_create_retried(
    os: &Arc<dyn ObjectStore>,
    key: &Key,
    data: &[u8],
    retry_for: Duration,
) -> object_store::Result<object_store::PutResult> {
    let start = std::time::Instant::now();
    let mut wait = Duration::from_millis(100);
    loop {
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        match os.put_opts(key, PutPayload::from(data.to_vec()), opts).await {
            Err(e) if retryable(&e) && start.elapsed() + wait < retry_for => {
                tracing::debug!("uploading {key}: {e}; trying again in {wait:?}");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            r => return r,
        }
    }
}

/// A failure another try may not meet: not a refusal of the request
/// itself (the object exists, a condition failed, no such bucket, no
/// permission).
fn retryable(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    !matches!(
        e,
        E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotFound { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::NotImplemented { .. }
            | E::NotSupported { .. }
            | E::InvalidPath { .. }
    )
}

impl Remote {
    /// Connect (lazily: the first request does) to the bucket of `url`,
    /// configured from the environment: AWS_ENDPOINT_URL, AWS_REGION,
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the rest the
    /// `object_store` crate reads.
    pub fn new(url: &S3Url, endpoint: Option<&str>, retry_for: Duration) -> io::Result<Remote> {
        check_endpoint(endpoint)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("zlogfs-s3")
            .enable_all()
            .build()?;
        let client = ClientOptions::new()
            .with_allow_http(true)
            .with_timeout(Duration::from_secs(30))
            .with_connect_timeout(Duration::from_secs(5));
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            // The budget is time (retry_for), not a count: quick
            // failures (a refused connection) ran out of 10 tries in
            // about 2.5 s.
            max_retries: usize::MAX,
            retry_timeout: retry_for,
        };
        let counters = Arc::new(Counters::default());
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&url.bucket)
            .with_client_options(client)
            .with_retry(retry)
            .with_http_connector(CountingConnector(Arc::clone(&counters)))
            .with_conditional_put(S3ConditionalPut::ETagMatch);
        if let Some(e) = endpoint {
            b = b.with_endpoint(e);
        }
        if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
            b = b.with_region("us-east-1");
        }
        let os = b.build().map_err(|e| io_err(&format!("configuring {url}"), e))?;
        let prefix = Key::from(url.prefix.as_str());
        Ok(Remote { rt, os: Arc::new(os), prefix, url: url.clone(), counters, retry_for })
    }

    /// Where this image lives, for messages.
    pub fn url(&self) -> &S3Url {
        &self.url
    }

    fn key(&self, rel: &str) -> Key {
        let mut k = self.prefix.clone();
        for part in rel.split('/') {
            k = k.clone().join(part);
        }
        k
    }

    /// Name of manifest `n`.
    pub fn manifest_key(&self, n: u64) -> Key {
        self.key(&format!("manifest/{n:020}"))
    }

    /// Name of a piece of segment `seg`'s generation `gen`.
    pub fn piece_key(&self, seg: u32, gen: u64, p: &Piece) -> Key {
        self.key(&format!("seg/{seg:08x}/{gen:016x}-{:08x}-{:016x}-{:016x}", p.offset, p.epoch, p.writer))
    }

    /// (segment, generation, piece) of a piece's name under this prefix
    /// (the piece's length unknown: 0).
    pub fn parse_piece(&self, key: &Key) -> Option<(u32, u64, Piece)> {
        let rel: Vec<_> = key.prefix_match(&self.prefix)?.map(|p| p.as_ref().to_string()).collect();
        let [dir, seg, name] = rel.as_slice() else { return None };
        let mut f = name.split('-');
        let (gen, off, epoch, writer) = (f.next()?, f.next()?, f.next()?, f.next()?);
        (dir == "seg").then_some(())?;
        let piece = Piece {
            offset: u32::from_str_radix(off, 16).ok()?,
            len: 0,
            epoch: u64::from_str_radix(epoch, 16).ok()?,
            writer: u64::from_str_radix(writer, 16).ok()?,
        };
        Some((u32::from_str_radix(seg, 16).ok()?, u64::from_str_radix(gen, 16).ok()?, piece))
    }

    /// Whether a manifest numbered above `n` exists.
    pub fn manifest_after(&self, n: u64) -> io::Result<bool> {
        add(&self.counters.lists, 1);
        let dir = self.key("manifest");
        let after = self.manifest_key(n);
        let what = format!("listing {dir}");
        let first = self.rt.block_on(async { self.os.list_with_offset(Some(&dir), &after).try_next().await });
        Ok(first.map_err(|e| io_err(&what, e))?.is_some())
    }

    /// Upload `data` as `key` unless an object of that name exists.
    pub fn put_create(&self, key: &Key, data: Vec<u8>) -> io::Result<Created> {
        let mut done = self.put_many(vec![(key.clone(), data)])?;
        done.pop().ok_or_else(|| io::Error::other("no reply to an upload"))
    }

    /// Upload several objects at once, create-only.
    pub fn put_many(&self, items: Vec<(Key, Vec<u8>)>) -> io::Result<Vec<Created>> {
        let futs = items.into_iter().map(|(key, data)| {
            let os = Arc::clone(&self.os);
            let len = data.len() as u64;
            add(&self.counters.puts, 1);
            let retry_for = self.retry_for;
            async move {
                let r = put_create_retried(&os, &key, &data, retry_for).await;
                (key, data, len, r)
            }
        });
        let done = self.rt.block_on(futures::future::join_all(futs));
        let mut out = Vec::with_capacity(done.len());
        for (key, data, len, r) in done {
            out.push(match r {
                Ok(_) => {
                    add(&self.counters.bytes_up, len);
                    Created::Yes
                }
                Err(object_store::Error::AlreadyExists { .. }) => {
                    // A retried request whose first try got through reads
                    // back as ours.
                    if self.get(&key, None)? == data {
                        Created::Yes
                    } else {
                        Created::Taken
                    }
                }
                Err(e) => return Err(io_err(&format!("uploading {key}"), e)),
            });
        }
        Ok(out)
    }

    /// Read an object, or a range of it.
    pub fn get(&self, key: &Key, range: Option<Range<u64>>) -> io::Result<Vec<u8>> {
        add(&self.counters.gets, 1);
        let opts = GetOptions { range: range.map(GetRange::Bounded), ..Default::default() };
        let what = format!("reading {key}");
        let bytes = self.rt.block_on(async {
            let r = self.os.get_opts(key, opts).await?;
            r.bytes().await
        });
        let bytes = bytes.map_err(|e| io_err(&what, e))?;
        add(&self.counters.bytes_down, bytes.len() as u64);
        Ok(bytes.to_vec())
    }

    /// Read several objects at once.
    pub fn get_many(&self, keys: &[Key]) -> io::Result<Vec<Vec<u8>>> {
        add(&self.counters.gets, keys.len() as u64);
        let futs = keys.iter().map(|k| async move {
            let r = self.os.get_opts(k, GetOptions::default()).await?;
            r.bytes().await
        });
        let all = self.rt.block_on(futures::future::join_all(futs));
        let mut out = Vec::with_capacity(all.len());
        for (k, r) in keys.iter().zip(all) {
            let b = r.map_err(|e| io_err(&format!("reading {k}"), e))?;
            add(&self.counters.bytes_down, b.len() as u64);
            out.push(b.to_vec());
        }
        Ok(out)
    }

    /// Every object under `rel` (a folder of this prefix).
    pub fn list(&self, rel: &str) -> io::Result<Vec<Key>> {
        add(&self.counters.lists, 1);
        let dir = self.key(rel);
        let what = format!("listing {dir}");
        let metas: Vec<_> = self
            .rt
            .block_on(self.os.list(Some(&dir)).try_collect::<Vec<_>>())
            .map_err(|e| io_err(&what, e))?;
        Ok(metas.into_iter().map(|m| m.location).collect())
    }

    /// The numbers of the manifests in the bucket.
    pub fn manifests(&self) -> io::Result<Vec<u64>> {
        let mut v: Vec<u64> =
            self.list("manifest")?.iter().filter_map(|k| k.filename().and_then(|f| f.parse().ok())).collect();
        v.sort_unstable();
        Ok(v)
    }

    /// Delete objects; a missing one is no error.
    pub fn delete(&self, keys: Vec<Key>) -> io::Result<()> {
        add(&self.counters.deletes, keys.len() as u64);
        let futs = keys.iter().map(|k| self.os.delete(k));
        for (k, r) in keys.iter().zip(self.rt.block_on(futures::future::join_all(futs))) {
            match r {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(io_err(&format!("deleting {k}"), e)),
            }
        }
        Ok(())
    }
}
