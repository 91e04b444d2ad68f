# Lattice's eBPF telemetry programs (book: "Telemetry Architecture", layer 1), in BPF assembly for
# llvm-mc (`llvm-mc -triple=bpfel -filetype=obj`; agent/build.rs does it with the `ebpf` feature).
#
# tracepoint/sched/sched_switch: CPU time per process. Per CPU, `last_switch` holds the time of the
#   previous switch; the time since then is charged to the task switching out (the current task), by
#   tgid, in `cpu_ns` (HASH u32 -> u64 nanoseconds).
# tracepoint/block/block_bio_queue: block I/O per process, in the submitter's context: nr_sector * 512
#   bytes (format offset 24) added to `io_bytes[tgid]` (HASH u32 -> {read u64, write u64}) by the first
#   character of rwbs (offset 28): 'R' read, 'W' write; others (flush, discard) are not counted.
# tracepoint/syscalls/sys_enter_openat: audit mode (sensitive allocations). A task whose cgroup (v2 id,
#   helper 80) is in `watched` (HASH u64 -> u32 slot, filled by the agent for each sensitive allocation's
#   own cgroup) has each openat recorded into the ring buffer `opens` (RINGBUF, helper 130 output):
#   {slot u32, flags u32 (format offset 32), tgid u32, pad u32, filename [256] (offset 24, read with
#   helper 114 probe_read_user_str)} — 272 bytes. A record the ring has no room for is counted in
#   `lost` (ARRAY, one u64), which the agent reports.
# Maps use the legacy `maps` section (struct bpf_map_def: type, key_size, value_size, max_entries,
#   flags), which aya loads without BTF. Helpers: 1 map_lookup_elem, 2 map_update_elem,
#   5 ktime_get_ns, 14 get_current_pid_tgid, 80 get_current_cgroup_id, 114 probe_read_user_str,
#   130 ringbuf_output. Map types: 1 HASH, 2 ARRAY, 6 PERCPU_ARRAY, 27 RINGBUF.

	.text
	.section	"tracepoint/sched/sched_switch","ax",@progbits
	.globl	sched_switch
	.p2align	3
	.type	sched_switch,@function
sched_switch:
	call 5
	r6 = r0
	r1 = 0
	*(u32 *)(r10 - 4) = r1
	r2 = r10
	r2 += -4
	r1 = last_switch ll
	call 1
	if r0 == 0 goto LBB0_out
	r8 = *(u64 *)(r0 + 0)
	*(u64 *)(r0 + 0) = r6
	if r8 == 0 goto LBB0_out
	r6 -= r8
	call 14
	r0 >>= 32
	*(u32 *)(r10 - 8) = r0
	r2 = r10
	r2 += -8
	r1 = cpu_ns ll
	call 1
	if r0 == 0 goto LBB0_insert
	lock *(u64 *)(r0 + 0) += r6
	goto LBB0_out
LBB0_insert:
	*(u64 *)(r10 - 16) = r6
	r2 = r10
	r2 += -8
	r3 = r10
	r3 += -16
	r1 = cpu_ns ll
	r4 = 1
	call 2
LBB0_out:
	r0 = 0
	exit
.Lfunc_end0:
	.size	sched_switch, .Lfunc_end0-sched_switch

	.section	"tracepoint/block/block_bio_queue","ax",@progbits
	.globl	block_bio_queue
	.p2align	3
	.type	block_bio_queue,@function
block_bio_queue:
	r7 = *(u32 *)(r1 + 24)
	r7 <<= 9
	r8 = *(u8 *)(r1 + 28)
	call 14
	r0 >>= 32
	*(u32 *)(r10 - 4) = r0
	r2 = r10
	r2 += -4
	r1 = io_bytes ll
	call 1
	if r0 != 0 goto LBB1_add
	r1 = 0
	*(u64 *)(r10 - 24) = r1
	*(u64 *)(r10 - 16) = r1
	r2 = r10
	r2 += -4
	r3 = r10
	r3 += -24
	r1 = io_bytes ll
	r4 = 1
	call 2
	r2 = r10
	r2 += -4
	r1 = io_bytes ll
	call 1
	if r0 == 0 goto LBB1_out
LBB1_add:
	if r8 == 87 goto LBB1_write
	if r8 != 82 goto LBB1_out
	lock *(u64 *)(r0 + 0) += r7
	goto LBB1_out
LBB1_write:
	lock *(u64 *)(r0 + 8) += r7
LBB1_out:
	r0 = 0
	exit
.Lfunc_end1:
	.size	block_bio_queue, .Lfunc_end1-block_bio_queue

	.section	"tracepoint/syscalls/sys_enter_openat","ax",@progbits
	.globl	sys_enter_openat
	.p2align	3
	.type	sys_enter_openat,@function
sys_enter_openat:
	r6 = r1
	call 80
	*(u64 *)(r10 - 280) = r0
	r2 = r10
	r2 += -280
	r1 = watched ll
	call 1
	if r0 == 0 goto LBB2_out
	r7 = *(u32 *)(r0 + 0)
	*(u32 *)(r10 - 272) = r7
	r1 = *(u64 *)(r6 + 32)
	*(u32 *)(r10 - 268) = r1
	call 14
	r0 >>= 32
	*(u32 *)(r10 - 264) = r0
	r1 = 0
	*(u32 *)(r10 - 260) = r1
	r1 = r10
	r1 += -256
	r2 = 256
	r3 = *(u64 *)(r6 + 24)
	call 114
	r1 = opens ll
	r2 = r10
	r2 += -272
	r3 = 272
	r4 = 0
	call 130
	if r0 == 0 goto LBB2_out
	r1 = 0
	*(u32 *)(r10 - 280) = r1
	r2 = r10
	r2 += -280
	r1 = lost ll
	call 1
	if r0 == 0 goto LBB2_out
	r1 = 1
	lock *(u64 *)(r0 + 0) += r1
LBB2_out:
	r0 = 0
	exit
.Lfunc_end2:
	.size	sys_enter_openat, .Lfunc_end2-sys_enter_openat

	.type	last_switch,@object
	.section	maps,"aw",@progbits
	.globl	last_switch
	.p2align	2
last_switch:
	.long	6
	.long	4
	.long	8
	.long	1
	.long	0
	.size	last_switch, 20

	.type	cpu_ns,@object
	.globl	cpu_ns
	.p2align	2
cpu_ns:
	.long	1
	.long	4
	.long	8
	.long	65536
	.long	0
	.size	cpu_ns, 20

	.type	io_bytes,@object
	.globl	io_bytes
	.p2align	2
io_bytes:
	.long	1
	.long	4
	.long	16
	.long	65536
	.long	0
	.size	io_bytes, 20

	.type	watched,@object
	.globl	watched
	.p2align	2
watched:
	.long	1
	.long	8
	.long	4
	.long	1024
	.long	0
	.size	watched, 20

	.type	opens,@object
	.globl	opens
	.p2align	2
opens:
	.long	27
	.long	0
	.long	0
	.long	4194304
	.long	0
	.size	opens, 20

	.type	lost,@object
	.globl	lost
	.p2align	2
lost:
	.long	2
	.long	4
	.long	8
	.long	1
	.long	0
	.size	lost, 20

	.type	_license,@object
	.section	license,"aw",@progbits
	.globl	_license
_license:
	.asciz	"GPL"
	.size	_license, 4
