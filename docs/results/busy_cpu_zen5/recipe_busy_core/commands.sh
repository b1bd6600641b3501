cd <checkout>
python3 -c "while True: pass" & L=$!
sleep 1
s=$(date +%s.%N)
.venv/bin/python train.py experiment=cifar10_cpu data.root=<cifar10> trainer.seed=0 hydra.run.dir=<out> > <out>.log 2>&1
e=$(date +%s.%N); kill $L; echo "wall from outside the process: $(echo "$e - $s" | bc) s" > <out>/recipe_wall.log
