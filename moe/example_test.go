package moe_test

import (
	"fmt"
	"log"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

// A trainer's state, gathered to rank 0 after 3 steps and restored into a
// new trainer, which then takes the step the first would have taken, bit
// for bit (package moe/runs keeps the state in a checkpoint file between
// the two).
func ExampleTrainer_RestoreState() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	cfg := moe.TrainConfig{Config: moe.Config{Mode: ep.LowLatency, DType: moe.Float32, Experts: 2 * world.Size(), TopK: 2,
		Hidden: 8, FFN: 16, Tokens: 16, Act: moe.SiLU, Seed: 1}, TeacherSeed: 2, LR: 0.01}
	first, err := moe.NewTrainer(world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer first.Close()
	for i := 0; i < 3; i++ {
		if _, err := first.Step(); err != nil {
			log.Fatal(err)
		}
	}
	st, err := first.GatherState() // rank 0's; nil on the others
	if err != nil {
		log.Fatal(err)
	}
	second, err := moe.NewTrainer(world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer second.Close()
	if err := second.RestoreState(st); err != nil {
		log.Fatal(err)
	}
	a, err := first.Step()
	if err != nil {
		log.Fatal(err)
	}
	b, err := second.Step()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("step", b.Step, "the same loss:", a.Loss == b.Loss)
	// Output: step 4 the same loss: true
}
