"""What the code costs: transforms, the simulator, the parameter server, sharded servers, node aggregation, start-up."""
