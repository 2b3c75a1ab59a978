//! The KServe v2 `system_shared_memory` extension: a client's POSIX
//! shared-memory regions (`shm_open` keys, `/dev/shm/KEY`), registered by
//! name, an infer request's inputs read from them and its outputs written
//! into them, over HTTP and gRPC. Regions are the server's (not a
//! connection's), at most `MAX_REGIONS`.
//!
//! Safety: a region is checked at its register (the key one name under
//! `/dev/shm`, a regular file, `offset + byte_size` within the file) and
//! mapped read/write for its lifetime; every read and write is checked
//! against the registered bounds and, before it, the file's length again
//! (a client that shrinks its file after registering it is refused, not
//! faulted on). A request holds its regions' mappings from its checks to
//! its answer: a region unregistered meanwhile is unmapped after it.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions};

/// The regions one server holds at once, by default.
pub const MAX_REGIONS: usize = 64;

/// What CUDA shared memory's calls are told.
pub const NO_CUDA: &str = "CUDA shared memory is not served: laned runs on CPU";

/// One registered region.
pub(crate) struct Region {
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) offset: u64,
    pub(crate) byte_size: u64,
    file: File,
    map: Mutex<MmapMut>,
}

/// A refused call: why, and whether it names something not there (404,
/// NOT_FOUND) or a conflict (409, ALREADY_EXISTS) rather than a bad
/// argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShmError {
    Bad(String),
    NotFound(String),
    Exists(String),
    Full(String),
}

impl ShmError {
    pub(crate) fn why(&self) -> &str {
        match self {
            ShmError::Bad(w) | ShmError::NotFound(w) | ShmError::Exists(w) | ShmError::Full(w) => w,
        }
    }
}

impl Region {
    /// `len` bytes at `offset` within the region: checked against its
    /// registered size and its file's length now.
    fn span(&self, offset: u64, len: u64) -> Result<(usize, usize), String> {
        let end = offset
            .checked_add(len)
            .filter(|end| *end <= self.byte_size)
            .ok_or_else(|| {
                format!(
                    "shared memory region {:?}: {len} bytes at offset {offset} pass its end ({} bytes registered)",
                    self.name, self.byte_size
                )
            })?;
        let file_len = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        if self.offset.saturating_add(end) > file_len {
            return Err(format!(
                "shared memory region {:?}: its file {:?} is now {file_len} bytes, shorter than registered",
                self.name, self.key
            ));
        }
        Ok((offset as usize, end as usize))
    }

    /// A copy of `len` bytes at `offset`.
    pub(crate) fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let (from, to) = self.span(offset, len)?;
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        Ok(map[from..to].to_vec())
    }

    /// `bytes` written at `offset`.
    pub(crate) fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), String> {
        let (from, to) = self.span(offset, bytes.len() as u64)?;
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map[from..to].copy_from_slice(bytes);
        Ok(())
    }
}

/// A tensor's place in a region, as an infer request gives it
/// (`shared_memory_region`, `shared_memory_byte_size`,
/// `shared_memory_offset`), the region held.
#[derive(Clone)]
pub(crate) struct Place {
    pub(crate) region: Arc<Region>,
    pub(crate) byte_size: u64,
    pub(crate) offset: u64,
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}..+{}]", self.region.name, self.offset, self.byte_size)
    }
}

impl Place {
    /// The input's bytes, `want` of them (its byte size must be the
    /// tensor's).
    pub(crate) fn input(&self, what: &str, want: usize) -> Result<Vec<u8>, String> {
        if self.byte_size != want as u64 {
            return Err(format!(
                "{what}: shared_memory_byte_size {}, the tensor is {want} bytes",
                self.byte_size
            ));
        }
        self.region.read(self.offset, self.byte_size)
    }

    /// Checked for an output of `len` bytes before the call: the place
    /// holds it, within the region.
    pub(crate) fn check_output(&self, what: &str, len: usize) -> Result<(), String> {
        if self.byte_size < len as u64 {
            return Err(format!(
                "{what}: shared_memory_byte_size {}, the tensor is {len} bytes",
                self.byte_size
            ));
        }
        self.region.span(self.offset, self.byte_size).map(|_| ())
    }
}

/// The server's regions.
pub(crate) struct Regions {
    max: usize,
    table: Mutex<HashMap<String, Arc<Region>>>,
}

impl Default for Regions {
    fn default() -> Regions {
        Regions::new(MAX_REGIONS)
    }
}

impl Regions {
    pub(crate) fn new(max: usize) -> Regions {
        Regions {
            max,
            table: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Region>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Region `name`: `byte_size` bytes at `offset` of the shared memory
    /// `key`, checked and mapped.
    pub(crate) fn register(&self, name: &str, key: &str, offset: u64, byte_size: u64) -> Result<(), ShmError> {
        let bad = |why: String| Err(ShmError::Bad(why));
        if name.is_empty() {
            return bad("a shared memory region needs a name".into());
        }
        let file_name = key.strip_prefix('/').unwrap_or(key);
        if file_name.is_empty() || file_name.contains('/') || file_name == "." || file_name == ".." {
            return bad(format!(
                "shared memory region {name:?}: key {key:?}: wanted a shm_open key, one name (\"/laned_in\")"
            ));
        }
        if byte_size == 0 {
            return bad(format!("shared memory region {name:?}: byte_size 0"));
        }
        if self.lock().contains_key(name) {
            return Err(ShmError::Exists(format!(
                "shared memory region {name:?} is registered already: unregister it first"
            )));
        }
        let path = std::path::Path::new("/dev/shm").join(file_name);
        let file = match std::fs::OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) => {
                return Err(ShmError::NotFound(format!(
                    "shared memory region {name:?}: key {key:?}: {e}"
                )))
            }
        };
        let meta = file
            .metadata()
            .map_err(|e| ShmError::Bad(format!("shared memory region {name:?}: key {key:?}: {e}")))?;
        if !meta.is_file() {
            return bad(format!(
                "shared memory region {name:?}: key {key:?} is not a shared memory object"
            ));
        }
        let fits = offset.checked_add(byte_size).is_some_and(|end| end <= meta.len());
        if !fits {
            return bad(format!(
                "shared memory region {name:?}: offset {offset} + byte_size {byte_size} pass the end of {key:?} \
                 ({} bytes)",
                meta.len()
            ));
        }
        let Ok(len) = usize::try_from(byte_size) else {
            return bad(format!("shared memory region {name:?}: too large to map"));
        };
        // SAFETY: the mapping is of a regular file checked to hold it; the
        // client may write to it meanwhile (shared memory is that), and
        // every access is bounds-checked and copies.
        let map = unsafe { MmapOptions::new().offset(offset).len(len).map_mut(&file) }
            .map_err(|e| ShmError::Bad(format!("shared memory region {name:?}: mapping {key:?}: {e}")))?;
        let mut table = self.lock();
        if table.contains_key(name) {
            return Err(ShmError::Exists(format!(
                "shared memory region {name:?} is registered already: unregister it first"
            )));
        }
        if table.len() >= self.max {
            return Err(ShmError::Full(format!(
                "{} shared memory regions registered, the most this server holds: unregister one",
                self.max
            )));
        }
        table.insert(
            name.to_string(),
            Arc::new(Region {
                name: name.to_string(),
                key: key.to_string(),
                offset,
                byte_size,
                file,
                map: Mutex::new(map),
            }),
        );
        Ok(())
    }

    /// Region `name` (every one where it is empty): `(name, key, offset,
    /// byte_size)`, by name.
    pub(crate) fn status(&self, name: &str) -> Result<Vec<(String, String, u64, u64)>, ShmError> {
        let table = self.lock();
        let mut out: Vec<_> = table
            .values()
            .filter(|r| name.is_empty() || r.name == name)
            .map(|r| (r.name.clone(), r.key.clone(), r.offset, r.byte_size))
            .collect();
        if !name.is_empty() && out.is_empty() {
            return Err(ShmError::NotFound(format!(
                "no shared memory region {name:?} registered"
            )));
        }
        out.sort();
        Ok(out)
    }

    /// Region `name` unregistered (every one where it is empty; a name not
    /// registered: nothing, as Triton does). Its mapping goes with the
    /// last request using it.
    pub(crate) fn unregister(&self, name: &str) {
        let mut table = self.lock();
        if name.is_empty() {
            table.clear();
        } else {
            table.remove(name);
        }
    }

    /// A tensor's place: region `name`, `byte_size` at `offset`.
    pub(crate) fn place(&self, what: &str, name: &str, byte_size: u64, offset: u64) -> Result<Place, String> {
        let region = self
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| format!("{what}: no shared memory region {name:?} registered"))?;
        region.span(offset, byte_size).map_err(|why| format!("{what}: {why}"))?;
        Ok(Place {
            region,
            byte_size,
            offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared-memory file of `len` bytes, removed on drop.
    struct Shm(std::path::PathBuf, String);
    impl Drop for Shm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    fn shm(tag: &str, len: u64) -> Shm {
        let key = format!("/laned_test_{}_{tag}", std::process::id());
        let path = std::path::Path::new("/dev/shm").join(&key[1..]);
        let f = File::create(&path).unwrap();
        f.set_len(len).unwrap();
        Shm(path, key)
    }

    #[test]
    fn regions_are_bounded_checked_and_refused_by_name() {
        let a = shm("a", 64);
        let r = Regions::new(2);
        r.register("in", &a.1, 16, 32).unwrap();
        let place = r.place("input x", "in", 8, 8).unwrap();
        place.region.write(8, &[7; 8]).unwrap();
        assert_eq!(place.input("input x", 8).unwrap(), vec![7; 8]);
        let bytes = std::fs::read(&a.0).unwrap();
        assert_eq!(&bytes[24..32], &[7; 8]);
        assert!(r.place("input x", "in", 8, 25).unwrap_err().contains("pass its end"));
        assert!(r
            .place("input x", "nope", 8, 0)
            .unwrap_err()
            .contains("no shared memory region \"nope\""));
        assert!(matches!(r.register("in", &a.1, 0, 8), Err(ShmError::Exists(_))));
        assert!(r
            .register("past", &a.1, 60, 8)
            .unwrap_err()
            .why()
            .contains("pass the end"));
        assert!(r
            .register("past", &a.1, 0, 65)
            .unwrap_err()
            .why()
            .contains("pass the end"));
        assert!(r
            .register("past", &a.1, u64::MAX, 2)
            .unwrap_err()
            .why()
            .contains("pass the end"));
        assert!(r
            .register("k", "/a/b", 0, 8)
            .unwrap_err()
            .why()
            .contains("shm_open key"));
        assert!(r.register("k", "/..", 0, 8).unwrap_err().why().contains("shm_open key"));
        assert!(matches!(
            r.register("k", "/laned_no_such_key", 0, 8),
            Err(ShmError::NotFound(_))
        ));
        r.register("two", &a.1, 0, 8).unwrap();
        assert!(matches!(r.register("three", &a.1, 0, 8), Err(ShmError::Full(_))));
        assert_eq!(r.status("").unwrap().len(), 2);
        assert!(r.status("nope").is_err());
        // A file shrunk under its region: refused at use, not faulted on.
        File::options().write(true).open(&a.0).unwrap().set_len(20).unwrap();
        assert!(place.region.read(0, 8).unwrap_err().contains("shorter than registered"));
        r.unregister("in");
        assert_eq!(r.status("").unwrap().len(), 1);
        r.unregister("");
        assert!(r.status("").unwrap().is_empty());
    }
}
