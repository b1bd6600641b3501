cd <checkout>
R="experiment=cifar10_cpu data.root=<cifar10> trainer.budget=null trainer.epochs=1 trainer.progressive_resize.min_size=null trainer.width_by_budget.widths=null model.embed_dim=144 model.num_heads=3 data.limit_train_samples=25600 trainer.limit_val_batches=4 trainer.save_checkpoints=false trainer.eval_flip=false trainer.eval_shift=0"
out=<out>
rm -rf $out; mkdir -p $out
one() { .venv/bin/python train.py $R trainer.threads=$1 hydra.run.dir=$out/$2 > $out/$2.log 2>&1; }
t() { date +%s.%N; }
s=$(t); one auto alone; echo "alone auto: $(echo "$(t) - $s" | bc) s"
s=$(t); one 2 before_a & one 2 before_b; wait; echo "two at once, threads=2 each: $(echo "$(t) - $s" | bc) s"
s=$(t); one auto after_a & one auto after_b; wait; echo "two at once, threads=auto each: $(echo "$(t) - $s" | bc) s"
s=$(t); one auto late_a & sleep 30; one auto late_b; wait; echo "the second 30 s later, threads=auto each: $(echo "$(t) - $s" | bc) s"
