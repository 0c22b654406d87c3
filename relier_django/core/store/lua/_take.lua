-- _take.lua: not a script. scripts.py pastes it where a script says '-- @include _take':
-- the pop that take.lua and take_inflight.lua share.
--
-- take_next(n): the next message of the first non-empty of the queue lists KEYS[1..n],
-- asked in that order, and its list's index i; nil when every list is empty. While
-- messages wait behind it, the list's doorbell (KEYS[n+i]) is rung again: one doorbell
-- wakes one waiting worker, and the next one is for another.
-- One LMPOP (Redis 7.0+) asks every list in that order: a worker's ask order has 20
-- lists or more (a queue's ten priority levels, the recovery queue's first), and an
-- RPOP of each empty one before the message cost about 40 % of take.lua's work
-- (bench/store_cost.py). An older server refuses LMPOP: the lists are asked one by one.
local function take_from(n, i, message)
  if redis.call('LLEN', KEYS[i]) > 0 then
    redis.call('ZADD', KEYS[n + i], 0, 'ring')
  end
  return i, message
end

local function take_next(n)
  local args = {string.format('%d', n)}
  for i = 1, n do
    args[i + 1] = KEYS[i]
  end
  args[n + 2] = 'RIGHT'
  local popped = redis.pcall('LMPOP', unpack(args))
  if type(popped) == 'table' and not popped.err then
    for i = 1, n do
      if KEYS[i] == popped[1] then
        return take_from(n, i, popped[2][1])
      end
    end
  elseif type(popped) ~= 'table' then
    return nil, nil  -- every list empty (a nil reply)
  end
  for i = 1, n do
    local message = redis.call('RPOP', KEYS[i])
    if message then
      return take_from(n, i, message)
    end
  end
  return nil, nil
end
