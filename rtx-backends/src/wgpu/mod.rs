//! The wgpu backend (cargo feature `wgpu`): compute kernels in WGSL on Vulkan, Metal or DX12,
//! and on Mesa's software Vulkan driver (llvmpipe) where there is no GPU, which is how CI
//! runs it.
//!
//! Like the CPU module it knows no IR: it takes kernel sources (emitted by
//! `rtx_ir::emit` from the fusion plan), buffers and the run-time meta words, and runs them.
//! Pipelines are compiled on first use and cached per device by source hash.
//!
//! Dispatches are recorded into one command encoder and submitted together (every
//! `MAX_RECORDED` dispatches, before a read-back, or on [`WgpuDevice::submit`]): one
//! submission per dispatch, each waiting on its own error scopes, cost more than llvmpipe's
//! small kernels and would cost a real GPU its launch rate. Allocations, pipeline builds and
//! submissions run inside error scopes, and errors raised elsewhere (a recorded dispatch
//! wgpu rejects) are caught by the device's handler and returned by the next call, so a bad
//! kernel or a too-large buffer is a [`GpuError`], never wgpu's default panic.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, mpsc};

mod attention;
mod disk_cache;
mod kernels;
mod optim;
mod pool;
mod top_k;
mod window;

pub use crate::gpu_error::{GpuError, Result};
pub use attention::{ATTENTION_MAX_HEAD, AttentionShape};
pub use disk_cache::PipelineCacheStats;
pub use kernels::{GpuView, Reduce};
pub use optim::UpdateRule;
pub use window::{ConvPass, ConvShape, PoolPass};

/// Dispatches recorded before a submission: enough to keep a GPU fed while the host
/// records the next ones, few enough that the buffers they hold back stay bounded.
const MAX_RECORDED: usize = 64;

/// Bytes of dropped buffers held back for recorded commands past which they are submitted.
const MAX_HELD_BYTES: u64 = 256 << 20;

/// One wgpu device and its queue, with the pipelines compiled on it.
pub struct WgpuDevice {
    device: ::wgpu::Device,
    queue: ::wgpu::Queue,
    info: ::wgpu::AdapterInfo,
    limits: ::wgpu::Limits,
    pipelines: Mutex<HashMap<u64, Arc<::wgpu::ComputePipeline>>>,
    pool: pool::Pool,
    batch: Mutex<Batch>,
    /// The first error wgpu raised outside an error scope, until a call returns it.
    uncaught: Arc<Mutex<Option<String>>>,
    /// The driver's compiled pipelines, kept on disk between processes (Vulkan only).
    disk: Option<disk_cache::DiskPipelines>,
}

/// Commands recorded and not yet submitted.
#[derive(Default)]
struct Batch {
    encoder: Option<::wgpu::CommandEncoder>,
    recorded: usize,
}

/// A buffer on a [`WgpuDevice`]: `len` 32-bit values (f32 or u32). On drop it goes back to
/// its device's cache for the next buffer of its size class.
pub struct GpuBuffer {
    buffer: std::mem::ManuallyDrop<::wgpu::Buffer>,
    len: usize,
    class: u64,
    pool: pool::Pool,
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        // SAFETY: `buffer` is taken once, here, and never used after.
        let buffer = unsafe { std::mem::ManuallyDrop::take(&mut self.buffer) };
        self.pool.give_back(self.class, buffer);
    }
}

impl GpuBuffer {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A kernel to run: its WGSL source, entry point and a name for errors.
#[derive(Clone, Copy, Debug)]
pub struct Kernel<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub entry: &'a str,
}

impl WgpuDevice {
    /// The first adapter wgpu finds (a discrete GPU preferred; llvmpipe counts), opened with
    /// its own limits, so kernels may bind as many storage buffers as it allows.
    pub fn open() -> Result<WgpuDevice> {
        let instance = ::wgpu::Instance::new(
            ::wgpu::InstanceDescriptor::new_without_display_handle_from_env(),
        );
        let adapter =
            pollster::block_on(instance.request_adapter(&::wgpu::RequestAdapterOptions {
                power_preference: ::wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            }))
            .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features = adapter.features() & ::wgpu::Features::PIPELINE_CACHE;
        let (device, queue) =
            pollster::block_on(adapter.request_device(&::wgpu::DeviceDescriptor {
                label: Some("rtx"),
                required_features: features,
                required_limits: limits.clone(),
                ..Default::default()
            }))
            .map_err(|e| GpuError::Device {
                adapter: info.name.clone(),
                message: e.to_string(),
            })?;
        let uncaught: Arc<Mutex<Option<String>>> = Arc::default();
        let slot = Arc::clone(&uncaught);
        device.on_uncaptured_error(Arc::new(move |e: ::wgpu::Error| {
            if let Ok(mut slot) = slot.lock()
                && slot.is_none()
            {
                *slot = Some(e.to_string());
            }
        }));
        let disk = if features.contains(::wgpu::Features::PIPELINE_CACHE) {
            disk_cache::DiskPipelines::open(&device, &info)
        } else {
            None
        };
        Ok(WgpuDevice {
            device,
            queue,
            info,
            limits,
            pipelines: Mutex::new(HashMap::new()),
            pool: pool::Pool::default(),
            batch: Mutex::new(Batch::default()),
            uncaught,
            disk,
        })
    }

    /// The error wgpu raised outside a scope since the last call that returned one.
    fn uncaught(&self) -> Result<()> {
        match self.uncaught.lock().ok().and_then(|mut e| e.take()) {
            Some(message) => Err(GpuError::Call(message)),
            None => Ok(()),
        }
    }

    /// Records commands into the open batch (opening one), and submits the batch once it
    /// holds `MAX_RECORDED` dispatches or holds back `MAX_HELD_BYTES` of dropped buffers.
    fn record(&self, f: impl FnOnce(&mut ::wgpu::CommandEncoder)) -> Result<()> {
        let mut batch = self.lock_batch()?;
        let encoder = batch.encoder.get_or_insert_with(|| {
            self.pool.hold();
            self.device.create_command_encoder(&Default::default())
        });
        f(encoder);
        batch.recorded += 1;
        if batch.recorded >= MAX_RECORDED || self.pool.held_bytes() >= MAX_HELD_BYTES {
            self.submit_locked(&mut batch)?;
        }
        drop(batch);
        self.uncaught()
    }

    fn lock_batch(&self) -> Result<std::sync::MutexGuard<'_, Batch>> {
        self.batch
            .lock()
            .map_err(|_| GpuError::Call("a thread panicked while recording commands".into()))
    }

    fn submit_locked(&self, batch: &mut Batch) -> Result<()> {
        batch.recorded = 0;
        let Some(encoder) = batch.encoder.take() else {
            return Ok(());
        };
        let submitted = self.scoped(0, || {
            self.queue.submit([encoder.finish()]);
        });
        // Submitted (or rejected, and then never run): held buffers may be reused.
        self.pool.release();
        submitted
    }

    /// Submits every recorded command; later read-backs and uploads are ordered after them.
    pub fn submit(&self) -> Result<()> {
        let mut batch = self.lock_batch()?;
        self.submit_locked(&mut batch)?;
        drop(batch);
        self.uncaught()
    }

    /// Submits every recorded command and waits until the device has run them all.
    pub fn finish(&self) -> Result<()> {
        self.submit()?;
        self.device
            .poll(::wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Call(e.to_string()))?;
        if let Some(disk) = &self.disk {
            disk.save_if_due();
        }
        Ok(())
    }

    /// The adapter's name and backend, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
    pub fn describe(&self) -> String {
        format!("{} ({:?})", self.info.name, self.info.backend)
    }

    /// Whether this is a software rasterizer (llvmpipe, WARP): correct, not fast.
    pub fn is_software(&self) -> bool {
        self.info.device_type == ::wgpu::DeviceType::Cpu
    }

    fn check_size(&self, bytes: u64) -> Result<()> {
        let limit = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        if bytes > limit {
            return Err(GpuError::TooLarge {
                requested: bytes,
                limit,
            });
        }
        Ok(())
    }

    /// Runs `f` inside out-of-memory and validation scopes and reports what they caught.
    fn scoped<T>(&self, requested: u64, f: impl FnOnce() -> T) -> Result<T> {
        let memory = self
            .device
            .push_error_scope(::wgpu::ErrorFilter::OutOfMemory);
        let validation = self
            .device
            .push_error_scope(::wgpu::ErrorFilter::Validation);
        let value = f();
        let invalid = pollster::block_on(validation.pop());
        let oom = pollster::block_on(memory.pop());
        if oom.is_some() {
            return Err(GpuError::OutOfMemory { requested });
        }
        if let Some(e) = invalid {
            return Err(GpuError::Call(e.to_string()));
        }
        Ok(value)
    }

    /// A buffer of at least `bytes` bytes (its size class), from the cache when one waits.
    fn allocate(&self, bytes: u64, len: usize) -> Result<GpuBuffer> {
        let bytes = bytes.max(4);
        self.check_size(bytes)?;
        let class = pool::class_of(bytes).min(
            self.limits
                .max_storage_buffer_binding_size
                .min(self.limits.max_buffer_size)
                .max(bytes),
        );
        let buffer = match self.pool.take(class) {
            Some(b) => b,
            None => self.scoped(class, || {
                self.device.create_buffer(&::wgpu::BufferDescriptor {
                    label: None,
                    size: class,
                    usage: ::wgpu::BufferUsages::STORAGE
                        | ::wgpu::BufferUsages::COPY_SRC
                        | ::wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })?,
        };
        Ok(GpuBuffer {
            buffer: std::mem::ManuallyDrop::new(buffer),
            len,
            class,
            pool: self.pool.clone(),
        })
    }

    fn upload_bytes(&self, bytes: &[u8], len: usize) -> Result<GpuBuffer> {
        let buf = self.allocate(bytes.len() as u64, len)?;
        if !bytes.is_empty() {
            // Staged by the queue and ordered before every later submission.
            self.queue.write_buffer(&buf.buffer, 0, bytes);
        }
        Ok(buf)
    }

    /// A buffer holding `data`.
    pub fn upload_f32(&self, data: &[f32]) -> Result<GpuBuffer> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload_bytes(&bytes, data.len())
    }

    /// A buffer holding `data` (meta words, indices).
    pub fn upload_u32(&self, data: &[u32]) -> Result<GpuBuffer> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload_bytes(&bytes, data.len())
    }

    /// A buffer of `len` zeros.
    pub fn zeros(&self, len: usize) -> Result<GpuBuffer> {
        let bytes = (len as u64).checked_mul(4).ok_or(GpuError::OutOfMemory {
            requested: u64::MAX,
        })?;
        let buf = self.allocate(bytes, len)?;
        self.record(|encoder| encoder.clear_buffer(&buf.buffer, 0, None))?;
        Ok(buf)
    }

    /// Bytes of freed buffers the device keeps for reuse.
    pub fn cached_bytes(&self) -> u64 {
        self.pool.cached_bytes()
    }

    /// The values of `buf`, copied back to the host (waits for queued work).
    pub fn read_f32(&self, buf: &GpuBuffer) -> Result<Vec<f32>> {
        if buf.len == 0 {
            return Ok(Vec::new());
        }
        // The host waits here anyway: a good moment to keep the pipeline cache on disk.
        if let Some(disk) = &self.disk {
            disk.save_if_due();
        }
        let bytes = buf.len as u64 * 4;
        let staging = self.scoped(bytes, || {
            self.device.create_buffer(&::wgpu::BufferDescriptor {
                label: Some("rtx readback"),
                size: bytes,
                usage: ::wgpu::BufferUsages::MAP_READ | ::wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        self.record(|encoder| encoder.copy_buffer_to_buffer(&buf.buffer, 0, &staging, 0, bytes))?;
        self.submit()?;
        let (tx, rx) = mpsc::channel();
        staging.map_async(::wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(::wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Call(e.to_string()))?;
        rx.recv()
            .map_err(|e| GpuError::Call(e.to_string()))?
            .map_err(|e| GpuError::Call(e.to_string()))?;
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| GpuError::Call(e.to_string()))?;
        let out = view
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        drop(view);
        staging.unmap();
        Ok(out)
    }

    fn pipeline(&self, kernel: &Kernel) -> Result<Arc<::wgpu::ComputePipeline>> {
        let mut h = DefaultHasher::new();
        (kernel.source, kernel.entry).hash(&mut h);
        let key = h.finish();
        if let Some(p) = self
            .pipelines
            .lock()
            .ok()
            .and_then(|c| c.get(&key).cloned())
        {
            return Ok(p);
        }
        let pipeline = self
            .scoped(0, || {
                let module = self
                    .device
                    .create_shader_module(::wgpu::ShaderModuleDescriptor {
                        label: Some(kernel.name),
                        source: ::wgpu::ShaderSource::Wgsl(kernel.source.into()),
                    });
                self.device
                    .create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
                        label: Some(kernel.name),
                        layout: None,
                        module: &module,
                        entry_point: Some(kernel.entry),
                        compilation_options: Default::default(),
                        cache: self.disk.as_ref().map(|d| &d.cache),
                    })
            })
            .map_err(|e| GpuError::Compile {
                name: kernel.name.to_string(),
                message: e.to_string(),
            })?;
        if let Some(disk) = &self.disk {
            disk.built();
        }
        let pipeline = Arc::new(pipeline);
        if let Ok(mut c) = self.pipelines.lock() {
            c.insert(key, Arc::clone(&pipeline));
        }
        Ok(pipeline)
    }

    /// Writes the persistent pipeline cache now if pipelines were built since its last write
    /// (it is also written on the way, at read-backs, at most once a second).
    pub fn save_pipeline_cache(&self) {
        if let Some(disk) = &self.disk {
            disk.save();
        }
    }

    /// What the persistent pipeline cache read when the device opened and last wrote; `None`
    /// where the backend keeps no pipeline cache (wgpu has one on Vulkan only).
    pub fn pipeline_cache(&self) -> Option<PipelineCacheStats> {
        self.disk.as_ref().map(|d| d.stats())
    }

    /// Compiles `kernel` (or finds it compiled) without running it.
    pub fn compile(&self, kernel: &Kernel) -> Result<()> {
        self.pipeline(kernel).map(|_| ())
    }

    /// Runs `kernel` once over `groups` workgroups with `buffers` bound in order at group 0,
    /// bindings 0, 1, ... (the kernel's declared bindings, all of them).
    pub fn dispatch(
        &self,
        kernel: &Kernel,
        buffers: &[&GpuBuffer],
        groups: [u32; 3],
    ) -> Result<()> {
        let pipeline = self.pipeline(kernel)?;
        let layout = pipeline.get_bind_group_layout(0);
        let entries: Vec<::wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| ::wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.buffer.as_entire_binding(),
            })
            .collect();
        let bind = self.device.create_bind_group(&::wgpu::BindGroupDescriptor {
            label: Some(kernel.name),
            layout: &layout,
            entries: &entries,
        });
        // wgpu validates a bind group as it is made: a rejected one never reaches the batch,
        // where it would make the whole encoder invalid and lose the work recorded with it.
        self.uncaught()
            .and_then(|()| {
                self.record(|encoder| {
                    let mut pass = encoder.begin_compute_pass(&Default::default());
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, &bind, &[]);
                    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                })
            })
            .map_err(|e| match e {
                GpuError::Call(message) => GpuError::Call(format!("`{}`: {message}", kernel.name)),
                other => other,
            })
    }

    /// Runs a fused pointwise kernel of `rtx_ir::emit` (its buffer order: meta, inputs,
    /// outputs) over `n` elements, `group` threads per workgroup.
    pub fn run_pointwise(
        &self,
        kernel: &Kernel,
        meta: &[u32],
        inputs: &[&GpuBuffer],
        outputs: &[&GpuBuffer],
        n: usize,
        group: u32,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let meta = self.upload_u32(meta)?;
        let mut buffers = vec![&meta];
        buffers.extend_from_slice(inputs);
        buffers.extend_from_slice(outputs);
        let groups = grid(n, group, self.limits.max_compute_workgroups_per_dimension)?;
        self.dispatch(kernel, &buffers, groups)
    }
}

/// Workgroups covering `n` threads of `group` each, over `x` and then `y` when `x` alone
/// would pass the per-dimension limit (the kernels count `x + y * groups_x * group`).
pub fn grid(n: usize, group: u32, per_dimension: u32) -> Result<[u32; 3]> {
    let groups = n.div_ceil(group.max(1) as usize);
    let per_dimension = per_dimension.max(1) as usize;
    let x = groups.min(per_dimension);
    let y = groups.div_ceil(x.max(1));
    if y > per_dimension {
        return Err(GpuError::Call(format!(
            "{n} elements need more than {per_dimension}^2 workgroups"
        )));
    }
    Ok([x as u32, y as u32, 1])
}
