# 2026-12-02 01:44-01:54 UTC, 2-core AMD EPYC Zen 5 (family 26, model 2, avx512_bf16), commit b3e4189 plus the
# eval mode of lab/busy_cpu.sh (committed with these records). The checkpoints: 2 steps of experiment=cifar10_cpu
# (the speed of a pass does not depend on the weights).
R="experiment=cifar10_cpu data.root=<cifar10> trainer.budget=null trainer.epochs=1 trainer.progressive_resize.min_size=null trainer.width_by_budget.widths=null data.limit_train_samples=512 trainer.limit_val_batches=1 trainer.eval_flip=false trainer.eval_shift=0"
for w in 96 144; do .venv/bin/python train.py $R model.embed_dim=$w model.num_heads=$((w/48)) hydra.run.dir=<ck>/$w; done
bash lab/busy_cpu.sh eval <ck>/96/checkpoints/last.pt <cifar10> none > eval.log
bash lab/busy_cpu.sh eval <ck>/144/checkpoints/last.pt <cifar10> bf16 >> eval.log
# alone_interleaved.log: the training step alone, 2 threads and auto alternating
for i in 1 2 3; do for t in 2 auto; do python lab/benchmark.py models=vit_cpu_recipe_144 amp=none device=cpu rounds=3 warmup=3 threads=$t; done; done
# eval_alone.log: vit-eval alone, 2 threads and auto alternating, with the count auto chose (last column)
for i in 1 2 3; do for t in 2 auto; do vit-eval checkpoint=<ck>/96/checkpoints/last.pt data.root=<cifar10> amp=none threads=$t json=<file>; done; done
