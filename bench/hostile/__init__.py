"""`make hostile`: cheating workers and a flooder beside honest ones, against a clean run."""
