-- release_done.lua: the broker accepted a released task: drop its DLQ entry for good.
-- KEYS[1]  DLQ entry hash
-- ARGV[1]  the fence release.lua minted
-- RETURNS  1 dropped; 0 the entry was not being released with that fence
if redis.call('HGET', KEYS[1], 'releasing') ~= ARGV[1] then
  return 0
end
return redis.call('DEL', KEYS[1])
