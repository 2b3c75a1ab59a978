//! The checked fetch: a cached file is read only if it is its pin, the
//! error for one that is not names both digests, and the cache's layout is
//! a folder per package version.

use laned_models::fetch::{self, or_skip, FetchError};
use laned_models::silero;

/// SHA-256 of the three bytes `abc` (FIPS 180-2's first example).
const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

/// The digest is SHA-256, lowercase hex.
#[test]
fn the_digest_is_sha256() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("abc");
    std::fs::write(&path, b"abc").unwrap();
    assert_eq!(fetch::sha256_of(&path).unwrap(), ABC);
}

/// A cached file that is not its pin is refused, the error naming the
/// file, the pin's digest and the file's; no download is tried.
#[test]
fn a_cached_file_with_another_digest_is_refused_naming_both() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("silero-vad-6.2.3");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(silero::PIN.name()), b"abc").unwrap();
    let err = silero::fetch_in(root.path()).unwrap_err();
    assert!(matches!(err, FetchError::Mismatch { .. }), "{err:?}");
    assert!(!err.is_unavailable(), "a wrong file is not a reason to skip");
    let message = err.to_string();
    assert!(message.contains(silero::PIN.sha256), "{message}");
    assert!(message.contains(ABC), "{message}");
    assert!(message.contains("silero_vad_op18_ifless.onnx"), "{message}");
}

/// The fetched model is its pin, and a copy of it in another cache is
/// read from there as it is (a folder per package version), unfetched.
#[test]
fn silero_fetched_is_its_pin_and_a_cached_copy_is_read() {
    let Some(path) = or_skip("Silero VAD", silero::fetch()) else {
        return;
    };
    assert_eq!(fetch::sha256_of(&path).unwrap(), silero::PIN.sha256);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("silero-vad-6.2.3");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&path, dir.join(silero::PIN.name())).unwrap();
    assert_eq!(silero::fetch_in(root.path()).unwrap(), dir.join(silero::PIN.name()));
}
