-- leader_release.lua: give the lease up if, and only if, the caller still holds it
-- (compare-and-delete), so a successor can take over at once on a clean exit.
--
-- KEYS[1]  leader key
-- ARGV[1]  candidate id
-- RETURNS  1 released; 0 not held by the caller
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
