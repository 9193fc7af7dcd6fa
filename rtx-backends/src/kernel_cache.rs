//! The persistent kernel cache of the CUDA and HIP backends: compiled code on disk, keyed by
//! the source, the target architecture, the compile options and the compiler's version, so
//! the next process loads a kernel instead of compiling it again (NVRTC takes seconds for a
//! model's module; the GPT's is 2.8 MB of cubin).
//!
//! An entry is one file named by a 64-bit FNV-1a hash of its key. The file starts with the
//! whole key, which a load compares, so a hash collision is a miss, never a wrong kernel.
//! Files are written to a temporary name and renamed, so a reader never sees half an entry;
//! an unreadable or malformed entry is a miss and is written again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Kernels compiled (not loaded) by this process, for tests and reports.
static COMPILED: AtomicUsize = AtomicUsize::new(0);

/// How many `get_or_compile` calls of this process ran the compiler.
pub fn compiled() -> usize {
    COMPILED.load(Ordering::Relaxed)
}

/// A directory of compiled kernels.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: PathBuf,
}

/// What a compiler produced: text (PTX) and a binary (cubin, AMD code object).
pub type Artifacts = (String, Vec<u8>);

impl KernelCache {
    /// The cache in `dir` (created on the first store).
    pub fn at(dir: impl Into<PathBuf>) -> KernelCache {
        KernelCache { dir: dir.into() }
    }

    /// `$RTX_KERNEL_CACHE`, else `$XDG_CACHE_HOME/rtx/kernels`, else
    /// `$HOME/.cache/rtx/kernels`, else `rtx-kernels` in the temporary directory.
    pub fn default_location() -> KernelCache {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let dir = var("RTX_KERNEL_CACHE")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("rtx/kernels")))
            .or_else(|| var("HOME").map(|d| d.join(".cache/rtx/kernels")))
            .unwrap_or_else(|| std::env::temp_dir().join("rtx-kernels"));
        KernelCache { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry of `key` (its parts: compiler and version, architecture, options, source),
    /// or what `compile` makes, stored for next time. A cache that cannot be written only
    /// costs the next process a compile.
    pub fn get_or_compile<E>(
        &self,
        key: &[&str],
        compile: impl FnOnce() -> Result<Artifacts, E>,
    ) -> Result<Artifacts, E> {
        let key_text = key.join("\u{1f}");
        let path = self
            .dir
            .join(format!("{:016x}.bin", fnv1a(key_text.as_bytes())));
        if let Some(hit) = std::fs::read(&path)
            .ok()
            .and_then(|bytes| decode(&bytes, &key_text))
        {
            return Ok(hit);
        }
        COMPILED.fetch_add(1, Ordering::Relaxed);
        let made = compile()?;
        let _ = self.store(&path, &key_text, &made);
        Ok(made)
    }

    fn store(&self, path: &Path, key: &str, (text, binary): &Artifacts) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut bytes = Vec::with_capacity(24 + key.len() + text.len() + binary.len());
        for part in [key.as_bytes(), text.as_bytes()] {
            bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
            bytes.extend_from_slice(part);
        }
        bytes.extend_from_slice(binary);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &bytes)?;
        std::fs::rename(&tmp, path)
    }
}

/// The artifacts of an entry whose key is `key`, or `None`.
fn decode(bytes: &[u8], key: &str) -> Option<Artifacts> {
    let mut at = 0;
    let mut part = || -> Option<&[u8]> {
        let len = u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?) as usize;
        let start = at + 8;
        let end = start.checked_add(len)?;
        at = end;
        bytes.get(start..end)
    };
    if part()? != key.as_bytes() {
        return None;
    }
    let text = String::from_utf8(part()?.to_vec()).ok()?;
    Some((text, bytes.get(at..)?.to_vec()))
}

/// FNV-1a, 64 bits: stable across processes and builds (std's hashers promise neither).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rtx-cache-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_stored_entry_is_loaded_without_compiling() {
        let cache = KernelCache::at(fresh_dir("hit"));
        let first: Result<_, ()> = cache.get_or_compile(&["c", "sm_90", "src"], || {
            Ok(("ptx".to_string(), vec![1, 2, 3]))
        });
        let second: Result<_, ()> =
            cache.get_or_compile(&["c", "sm_90", "src"], || panic!("compiled again"));
        assert_eq!(first.unwrap(), second.unwrap());
    }

    #[test]
    fn another_key_or_a_damaged_entry_compiles_again() {
        let dir = fresh_dir("miss");
        let cache = KernelCache::at(&dir);
        let made = |v: u8| move || -> Result<Artifacts, ()> { Ok((String::new(), vec![v])) };
        cache.get_or_compile(&["c", "sm_90", "a"], made(1)).unwrap();
        let other = cache.get_or_compile(&["c", "sm_80", "a"], made(2)).unwrap();
        assert_eq!(other.1, vec![2]);
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::write(entry.unwrap().path(), b"\x05\0\0").unwrap();
        }
        let again = cache.get_or_compile(&["c", "sm_90", "a"], made(3)).unwrap();
        assert_eq!(again.1, vec![3]);
    }
}
