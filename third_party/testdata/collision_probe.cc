// Built twice, as two shared libraries that both define the same symbol: the collision
// symbol_collision_test.cc must report.
int PlaitCollisionProbe() { return 1; }
