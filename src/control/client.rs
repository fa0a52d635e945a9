//! The command's side: one request, its progress, its answer.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde_json::{Map, Value};

use super::VERSION;

/// Send `req` (its fields; the version is added) to the daemon at `path`;
/// `progress` sees each progress object. The result, or the error the
/// daemon answered or the one met reaching it.
pub fn request(
    path: &Path,
    mut req: Map<String, Value>,
    progress: &mut dyn FnMut(&Value),
) -> Result<Value, String> {
    let reach = |e: std::io::Error| format!("cannot reach the mount's daemon at {}: {e}", path.display());
    let mut s = UnixStream::connect(path).map_err(reach)?;
    req.insert("v".into(), Value::from(VERSION));
    let mut line = Value::Object(req).to_string();
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(reach)?;
    for l in BufReader::new(s).lines() {
        let l = l.map_err(reach)?;
        let v: Value =
            serde_json::from_str(&l).map_err(|e| format!("the daemon's answer is not JSON: {e}"))?;
        if let Some(p) = v.get("progress") {
            progress(p);
            continue;
        }
        return match v.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
            _ => Err(v.get("error").and_then(Value::as_str).unwrap_or("the daemon failed").to_string()),
        };
    }
    Err(format!("the mount's daemon at {} hung up without an answer", path.display()))
}
