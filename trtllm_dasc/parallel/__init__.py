"""Tensor parallelism over MPI: T ranks under one ``mpirun``; rank 0 schedules and broadcasts each StepPlan,
every rank executes it on its shard (the linear-attention heads, its state rows, its KV and its share of
every checkpoint). mpi4py carries the plans (plain data, pickled); torch.distributed carries tensors
(gloo on CPU ranks, NCCL on GPUs).

  group.py    TPGroup: the ranks' communicators (MPI for control, torch.distributed for tensors)
  runner.py   DistributedRunner (rank 0: broadcast, then execute) and worker_loop (ranks 1..T-1)
  launch.py   finding mpirun and running a job on T ranks (run_ranks: what every rank does)
"""
