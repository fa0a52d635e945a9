//! How to open an image in a bucket: its address, the sync mode, the
//! options.

use super::*;

/// `s3://BUCKET/PREFIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    /// The bucket.
    pub bucket: String,
    /// The folder of the image's objects in it ("" for the top).
    pub prefix: String,
}

impl S3Url {
    /// None when `s` is not an `s3://` address; an error when it is one
    /// without a bucket.
    pub fn parse(s: &str) -> Option<Result<S3Url, String>> {
        let rest = s.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Some(Err(format!("{s}: no bucket (use s3://BUCKET/PREFIX)")));
        }
        Some(Ok(S3Url { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() }))
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// When a sync returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// When the cache directory holds the data; uploads follow at sealed
    /// segments and checkpoints.
    #[default]
    Local,
    /// When the bucket holds it.
    Remote,
}

impl std::str::FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<SyncMode, String> {
        match s {
            "local" => Ok(SyncMode::Local),
            "remote" => Ok(SyncMode::Remote),
            _ => Err(format!("sync mode {s:?}: use local or remote")),
        }
    }
}

/// How to open an image in a bucket.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Where.
    pub url: S3Url,
    /// The local cache directory (created if missing; one image per
    /// directory; locked while open).
    pub cache_dir: PathBuf,
    /// When a sync returns.
    pub sync: SyncMode,
    /// Open without claiming the image: nothing is written to the bucket.
    pub read_only: bool,
    /// Bytes of segments already in the bucket the cache keeps (least
    /// recently used go first); data not yet uploaded is always kept.
    pub cache_bytes: u64,
    /// sync=local: how often the uploader looks for something to upload
    /// (it also starts when a segment is full).
    pub upload_every: Duration,
    /// sync=local: past this many bytes not yet uploaded, a sync waits
    /// for the uploads.
    pub max_backlog: u64,
    /// The server's address, when not AWS_ENDPOINT_URL's (or AWS's).
    pub endpoint: Option<String>,
    /// How long a request is retried (with backoff) before it fails.
    pub retry_for: Duration,
    /// How long a writer keeps the pieces a new manifest no longer names:
    /// readers still on an older manifest read them until they refresh.
    pub keep_replaced: Duration,
}

impl S3Options {
    /// Defaults for `url` and `cache_dir`: sync=local, a cache of 1 GiB,
    /// uploads every 5 seconds, a backlog of at most 256 MiB.
    pub fn new(url: S3Url, cache_dir: PathBuf) -> S3Options {
        S3Options {
            url,
            cache_dir,
            sync: SyncMode::Local,
            read_only: false,
            cache_bytes: 1 << 30,
            upload_every: Duration::from_secs(5),
            max_backlog: 256 << 20,
            endpoint: None,
            retry_for: retry_budget(),
            keep_replaced: Duration::from_secs(60),
        }
    }
}

/// How long a request is retried by default: 60 seconds, or
/// `ZLOGFS_S3_RETRY_SECONDS` from the environment (a server restart or a
/// load balancer's failover must be ridden out, not latch the image).
pub const DEFAULT_RETRY_SECS: u64 = 60;

fn retry_budget() -> Duration {
    let secs = std::env::var("ZLOGFS_S3_RETRY_SECONDS").ok().and_then(|v| v.trim().parse::<u64>().ok());
    Duration::from_secs(secs.unwrap_or(DEFAULT_RETRY_SECS))
}
