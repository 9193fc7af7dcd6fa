//! The wgpu backend's share of the persistent kernel cache: the adapter's pipeline cache
//! (`wgpu::PipelineCache`, the driver's compiled code for every pipeline built through it)
//! loaded from disk when the device opens and written back when new pipelines were built (at
//! a read-back or `finish`, at most once a second, since each write is the whole cache; and
//! on `WgpuDevice::save_pipeline_cache`), so the next process builds its pipelines from the
//! driver's cached code.
//!
//! wgpu offers this on Vulkan only (`Features::PIPELINE_CACHE`; Mesa's llvmpipe has it); on
//! Metal and DX12 the drivers keep their own caches, and this is `None`. The file is one per
//! adapter (`wgpu::util::pipeline_cache_key`: vendor and device), next to the CUDA and HIP
//! entries (`$RTX_KERNEL_CACHE/wgpu/`). wgpu checks a loaded blob's header against the
//! adapter and driver and starts empty when it does not match (`fallback: true`), so a
//! driver update or another machine's file costs a compile, never a wrong kernel. Writes go
//! to a temporary name and are renamed, so a reader never sees half a file.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::kernel_cache::KernelCache;

/// The pipeline cache of one device and where it lives on disk.
pub(super) struct DiskPipelines {
    pub(super) cache: ::wgpu::PipelineCache,
    path: PathBuf,
    loaded: usize,
    saved: AtomicUsize,
    /// Pipelines were built since the last write.
    dirty: AtomicBool,
    last_write: Mutex<Option<Instant>>,
}

/// The least time between two writes made on the way (`save_if_due`).
const WRITE_EVERY: Duration = Duration::from_secs(1);

/// What the pipeline cache of a device read when it opened and last wrote, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineCacheStats {
    pub loaded_bytes: usize,
    pub saved_bytes: usize,
}

impl DiskPipelines {
    /// The cache of `device` (opened with `PIPELINE_CACHE`) from its file, if the backend has
    /// one.
    pub(super) fn open(device: &::wgpu::Device, info: &::wgpu::AdapterInfo) -> Option<Self> {
        let key = ::wgpu::util::pipeline_cache_key(info)?;
        let path = KernelCache::default_location()
            .dir()
            .join("wgpu")
            .join(format!("{key}.bin"));
        let data = std::fs::read(&path).ok();
        // SAFETY: the data is what `PipelineCache::get_data` returned in an earlier process
        // (this module writes the file whole, by rename); wgpu checks its header against the
        // adapter and driver and, with `fallback`, ignores data it cannot use.
        let cache = unsafe {
            device.create_pipeline_cache(&::wgpu::PipelineCacheDescriptor {
                label: Some("rtx pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        Some(DiskPipelines {
            cache,
            path,
            loaded: data.map_or(0, |d| d.len()),
            saved: AtomicUsize::new(0),
            dirty: AtomicBool::new(false),
            last_write: Mutex::new(None),
        })
    }

    /// A pipeline was built through the cache.
    pub(super) fn built(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Writes the cache if pipelines were built since the last write and the last write was
    /// at least `WRITE_EVERY` ago.
    pub(super) fn save_if_due(&self) {
        if !self.dirty.load(Ordering::Relaxed) {
            return;
        }
        let due = self
            .last_write
            .lock()
            .map(|t| t.is_none_or(|t| t.elapsed() >= WRITE_EVERY))
            .unwrap_or(false);
        if due {
            self.save();
        }
    }

    /// Writes the cache's current data to its file if pipelines were built since the last
    /// write. A cache that cannot be written only costs the next process its compiles, so
    /// failures are not errors.
    pub(super) fn save(&self) {
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        if let Ok(mut t) = self.last_write.lock() {
            *t = Some(Instant::now());
        }
        let Some(data) = self.cache.get_data() else {
            return;
        };
        let (Some(dir), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return;
        };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let mut temp = name.to_os_string();
        temp.push(format!(".{}.tmp", std::process::id()));
        let temp = dir.join(temp);
        if std::fs::write(&temp, &data).is_ok() && std::fs::rename(&temp, &self.path).is_ok() {
            self.saved.store(data.len(), Ordering::Relaxed);
        } else {
            let _ = std::fs::remove_file(&temp);
        }
    }

    pub(super) fn stats(&self) -> PipelineCacheStats {
        PipelineCacheStats {
            loaded_bytes: self.loaded,
            saved_bytes: self.saved.load(Ordering::Relaxed),
        }
    }
}
