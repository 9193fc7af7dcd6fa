//! How a product is split into tasks over blocks of C.

use super::{B_IN_L2, MAX_ROW_PANELS, TASK_WORK};

/// How a product is split into tasks: blocks of rows of C (whole `mr`-row panels, at most
/// `MAX_ROW_PANELS` per block, dealt out evenly) and columns per task (`nc`, a multiple of
/// `nr`).
pub(crate) struct Blocking {
    pub row_blocks: usize,
    pub nc: usize,
    pub col_blocks: usize,
    m: usize,
    mr: usize,
}

impl Blocking {
    /// This blocking with whole rows per task: as many row blocks as this one has tasks
    /// (at least as many as it has row blocks), one column block of `n`.
    pub(crate) fn rows_only(self, n: usize) -> Blocking {
        let panels = self.m.div_ceil(self.mr);
        let tasks = (self.row_blocks * self.col_blocks)
            .min(panels)
            .max(self.row_blocks);
        Blocking {
            row_blocks: tasks,
            nc: n.max(1),
            col_blocks: 1,
            ..self
        }
    }

    /// First row and row count of row block `block`: the `mr`-row panels are dealt out
    /// evenly (block sizes differ by at most one panel), so no thread is left with a whole
    /// block more than another while the last block is a sliver.
    pub(crate) fn rows(&self, block: usize) -> (usize, usize) {
        let panels = self.m.div_ceil(self.mr);
        let first = block * panels / self.row_blocks;
        let end = (block + 1) * panels / self.row_blocks;
        let row0 = first * self.mr;
        (row0, (end * self.mr).min(self.m) - row0)
    }
}

/// Splits rows first, into enough blocks for every thread to get several tasks: each task
/// packs its own A block, so splitting columns as well would pack A again per column block.
/// Columns are split only when the rows cannot give every thread work. Blocking never
/// changes a result (K is never split), so it may follow the thread count.
pub(crate) fn blocking(
    m: usize,
    n: usize,
    batches: usize,
    k: usize,
    mr: usize,
    nr: usize,
    parallel_work: Option<usize>,
) -> Blocking {
    // Up to four tasks per thread for load balance, but none smaller than `TASK_WORK`
    // multiply-adds: below that a task's packing and hand-off cost more than its share.
    let wanted = match parallel_work {
        Some(work) => (work / TASK_WORK).clamp(1, 4 * rayon::current_num_threads()),
        None => 1,
    };
    let per_batch = wanted.div_ceil(batches).max(1);
    // Each row block reads all of B's columns, each column block packs all of A's rows again:
    // split the side that costs less to re-read (a 256-row A against a 1024-column B splits
    // columns, or every task would stream the whole of B from L3).
    let split = |row_blocks_wanted: usize| {
        let mc = (m.div_ceil(row_blocks_wanted).div_ceil(mr) * mr).clamp(mr, MAX_ROW_PANELS * mr);
        let row_blocks = m.div_ceil(mc);
        let col_blocks_wanted = per_batch.div_ceil(row_blocks).max(1);
        let nc = (n.div_ceil(col_blocks_wanted).div_ceil(nr) * nr).max(nr);
        let col_blocks = n.div_ceil(nc);
        (row_blocks, nc, col_blocks, row_blocks * n + col_blocks * m)
    };
    let rows_first = split(per_batch);
    let columns_first = split(1);
    // Re-reading B only costs when it does not stay in L2 between tasks.
    let b_spills = k.saturating_mul(n).saturating_mul(4) > B_IN_L2;
    let (row_blocks, nc, col_blocks, _) = if b_spills && columns_first.3 < rows_first.3 {
        columns_first
    } else {
        rows_first
    };
    Blocking {
        row_blocks,
        nc,
        col_blocks,
        m,
        mr,
    }
}
